"""The SDK's HTTP session skips its per-request environment lookups (proxies, netrc: a thread-pool
round trip each) exactly when the environment has neither, and keeps them otherwise."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from termgym.episode.spec import sandbox_spec
from termgym.sandboxes import create_sandbox
from termgym.sandboxes.daytona.policy import environment_routes_requests
from termgym.sandboxes.daytona.provider import close_providers, get_provider
from termgym.tasks import load_task
from tests.helpers import write_task
from tests.termgym.sandboxes.daytona.helpers import fast_settings

pytestmark = pytest.mark.usefixtures("daytona")


@pytest.mark.parametrize(
    ("proxies", "netrc", "routes"),
    [
        ({}, False, False),
        ({"no": "localhost"}, False, False),  # a bypass list alone routes nothing
        ({"ftp": "http://proxy:3128"}, False, False),  # not a scheme aiohttp proxies
        ({"http": ""}, False, False),
        ({"http": "http://proxy:3128"}, False, True),
        ({"https": "http://proxy:3128"}, False, True),
        ({"wss": "http://proxy:3128"}, False, True),
        ({}, True, True),  # a netrc file may hold credentials for the API's host
    ],
)
def test_environment_routes_requests(proxies, netrc, routes):
    assert environment_routes_requests(proxies, netrc) is routes


class CountingExecutor(ThreadPoolExecutor):
    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.submitted = 0

    def submit(self, fn, /, *args, **kwargs):
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


def clear_proxies(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.lower().endswith("_proxy"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("NETRC", str(tmp_path / "no-netrc"))


async def thread_jobs_per_exec(tmp_path: Path, execs: int = 5) -> tuple[bool, float]:
    """A fresh provider (reading the environment as it is now), one sandbox: whether the provider
    kept the SDK's lookups, and the thread-pool jobs the loop ran per ``exec`` request."""
    await close_providers()
    provider = get_provider(fast_settings())
    executor = CountingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    sandbox = create_sandbox("daytona", sandbox_spec(load_task(write_task(tmp_path / "task")), run_id="session"))
    await sandbox.start()
    try:
        before = executor.submitted
        for _ in range(execs):
            assert (await sandbox.exec(["true"], timeout=10)).exit_code == 0
        return provider.env_lookups, (executor.submitted - before) / execs
    finally:
        await sandbox.stop()


async def test_no_proxy_and_no_netrc_means_no_thread_hop_per_request(tmp_path, monkeypatch):
    clear_proxies(monkeypatch, tmp_path)
    lookups, jobs = await thread_jobs_per_exec(tmp_path)
    assert lookups is False
    assert jobs == 0


async def test_a_proxy_in_the_environment_keeps_the_sdks_lookups(tmp_path, monkeypatch):
    clear_proxies(monkeypatch, tmp_path)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # nothing listens there...
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # ...and the API is bypassed: requests still work
    lookups, jobs = await thread_jobs_per_exec(tmp_path)
    assert lookups is True
    assert jobs >= 1  # the SDK's own lookups, which the counter sees when they happen


async def test_a_netrc_file_keeps_the_sdks_lookups(tmp_path, monkeypatch):
    clear_proxies(monkeypatch, tmp_path)
    netrc = tmp_path / "netrc"
    netrc.write_text("machine elsewhere.example login user password secret\n")
    monkeypatch.setenv("NETRC", str(netrc))
    lookups, jobs = await thread_jobs_per_exec(tmp_path)
    assert lookups is True
    assert jobs >= 1
