"""``--keep`` and attach: a trial's sandbox left running past the process that made it, entered
again by id from another process, and removed by ``termgym gc`` (embedded) or the command
``keep`` gave (Docker). Every sandbox kept here is removed here."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from termgym.errors import ConfigError
from termgym.sandboxes import attach_sandbox, remove_leftovers
from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.capabilities import keep
from termgym.sandboxes.host_processes import alive, start_time
from termgym.sandboxes.local import LocalSandbox, collect_garbage
from termgym.sandboxes.local.kept import KEPT_STATE
from tests import helpers
from tests.helpers import require_docker, sandbox_processes, termgym_containers

ROOT = Path(__file__).resolve().parents[4]
TASK = "termgym/file-ops/bulk-rename"
REPORTS = {"ctrf.json", "reward.txt", "reward.json", "results.tap"}  # what a verifier may leave
EXPECTED = (ROOT / "envs/file-ops/bulk-rename/tests/expected_listing.txt").read_text().split()

# A process that makes a sandbox, writes a file and starts a background job in it, keeps it, and exits.
KEEPER_SCRIPT = textwrap.dedent(
    """
    import asyncio, json
    from termgym.sandboxes import create_sandbox
    from termgym.sandboxes.base import SandboxSpec

    async def main():
        sandbox = create_sandbox("local", SandboxSpec("keep-test", None, None, env={"KEPT": "yes"}))
        async with sandbox:
            await sandbox.exec(["sh", "-c", "echo before > /app/before.txt; sleep 1000 &"], timeout=10)
            kept = await sandbox.keep()
        print(json.dumps(kept))

    asyncio.run(main())
    """
)


def termgym(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The CLI in a process of its own (it exits before the test goes on), in ``cwd`` (its runs/ there)."""
    return helpers.termgym(*args, cwd=cwd, timeout=timeout)


def keep_in_subprocess() -> dict[str, str]:
    result = subprocess.run(
        [sys.executable, "-c", KEEPER_SCRIPT], capture_output=True, text=True, timeout=60, cwd=ROOT, env=os.environ
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


async def sh(sandbox, script: str) -> str:
    result = await sandbox.exec(["/bin/sh", "-c", script], timeout=10)
    assert result.exit_code == 0, result.text
    return result.text


async def test_check_keep_then_attach_then_gc(no_leaks: Path, tmp_path: Path) -> None:
    """check --keep prints how to enter and remove the sandbox; after the check process exited,
    attach enters it (what the oracle and the verifier wrote is there); gc removes it, names it,
    and attach then fails in one line."""
    result = termgym("check", TASK, "--agent", "oracle", "--keep", cwd=tmp_path)
    try:
        assert result.returncode == 0, result.stderr
        shown = " ".join(result.stdout.split())
        found = re.search(r"sandbox kept: enter it with `termgym shell --attach (\S+) --backend local`", shown)
        assert found, shown
        sandbox_id = found.group(1)
        assert f"remove it with `termgym gc --backend local {sandbox_id}`" in shown
        assert (no_leaks / sandbox_id / KEPT_STATE).is_file()

        sandbox = await attach_sandbox("local", sandbox_id)
        assert (await sh(sandbox, "ls /app/reports")).split() == EXPECTED  # the oracle's renames
        assert REPORTS & set((await sh(sandbox, "ls -A /logs/verifier")).split())  # the verifier's
        await sandbox.check_alive()
    finally:
        line = await remove_leftovers("local")
    assert line.startswith("removed 1 leftover local sandbox(es) (1 kept: tg-")
    assert sandbox_id in line
    assert not (no_leaks / sandbox_id).exists()
    with pytest.raises(ConfigError, match=f"^no kept sandbox {sandbox_id} "):
        await attach_sandbox("local", sandbox_id)


async def test_kept_sandbox_survives_its_process(no_leaks: Path) -> None:
    """The process that kept a sandbox has exited; its keeper runs on, in no session of the test's,
    its files and environment are there (its processes ended with the keeper's restart), two
    attaches enter the same sandbox, one that attached may keep it again, and stop() on an attached
    one removes it for real."""
    kept = keep_in_subprocess()
    assert kept["backend"] == "local"
    assert kept["attach"] == f"termgym shell --attach {kept['id']} --backend local"
    state = json.loads((no_leaks / kept["id"] / KEPT_STATE).read_text())
    bwrap = state["bwrap"][0]
    try:
        assert alive(bwrap) and start_time(bwrap) == state["bwrap"][1]
        assert os.getsid(bwrap) == bwrap  # a session of its own: no terminal hang-up reaches it
        first = await attach_sandbox("local", kept["id"])
        assert (await sh(first, "cat /app/before.txt")) == "before\n"
        assert (await sh(first, 'echo "$KEPT"')) == "yes\n"
        assert "sleep 1000" not in await sh(first, "ps -eo args")  # restarted keeper: agent processes ended
        await sh(first, "echo again > /app/again.txt")
        assert await keep(first) == kept  # kept again by the process that attached it
        await first.stop()  # leaves it alone
        second = await attach_sandbox("local", kept["id"])
        assert (await sh(second, "cat /app/again.txt")) == "again\n"
        await sh(second, "sleep 1000 &")
        await second.kill_agent_processes()  # now this process's sandbox: no longer kept, still usable
        assert "sleep 1000" not in await sh(second, "ps -eo args")
        assert not (no_leaks / kept["id"] / KEPT_STATE).exists()
        await second.stop()
        assert not (no_leaks / kept["id"]).exists()
        assert not alive(bwrap)
        with pytest.raises(ConfigError, match=r"^no kept sandbox "):
            await attach_sandbox("local", kept["id"])
    finally:
        collect_garbage(no_leaks)


async def test_gc_removes_kept_but_not_live(no_leaks: Path) -> None:
    """gc removes a kept sandbox and leaves one a live run (this process) still uses."""
    kept = keep_in_subprocess()
    live = LocalSandbox(SandboxSpec("live", None, None))
    async with live:
        try:
            line = await remove_leftovers("local")
            assert line.startswith(f"removed 1 leftover local sandbox(es) (1 kept: {kept['id']}) and ")
            assert (await sh(live, "echo alive")) == "alive\n"
            assert live.host_dir is not None and live.host_dir.exists()
        finally:
            collect_garbage(no_leaks)
    assert not [p for p in sandbox_processes() if str(no_leaks) in p]


async def test_reused_pid_is_never_killed(no_leaks: Path) -> None:
    """A kept.json whose keeper pid now names another process (here, this test's own, with another
    start time) is no kept sandbox: attach refuses it, gc removes the directory and signals nothing."""
    directory = no_leaks / "tg-stale-abc"
    directory.mkdir()
    (directory / "labels.json").write_text("{}")
    me, started = os.getpid(), start_time(os.getpid())
    assert started is not None
    (directory / KEPT_STATE).write_text(json.dumps({"bwrap": [me, started + 1], "keeper": me, "keeper_start": started}))
    with pytest.raises(ConfigError, match=r"^no kept sandbox tg-stale-abc "):
        await attach_sandbox("local", "tg-stale-abc")
    assert collect_garbage(no_leaks) == 1  # and this process lives on to see it
    assert not directory.exists()


async def test_gc_by_id_removes_that_one(no_leaks: Path, tmp_path: Path) -> None:
    """``termgym gc --backend local ID`` (the remove command keep gives) removes that kept sandbox and
    no other; asked again, it is one line and exit code 2."""
    kept, other = keep_in_subprocess(), keep_in_subprocess()
    try:
        result = termgym(*kept["remove"].split()[1:], cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"removed kept local sandbox {kept['id']}"
        assert not (no_leaks / kept["id"]).exists()
        assert (await sh(await attach_sandbox("local", other["id"]), "cat /app/before.txt")) == "before\n"
        again = termgym("gc", "--backend", "local", kept["id"], cwd=tmp_path)
        assert again.returncode == 2
        assert again.stderr.strip().splitlines() == [
            f"termgym: error: no kept sandbox {kept['id']} (termgym gc removed it, or it was never kept)"
        ]
    finally:
        collect_garbage(no_leaks)


@pytest.mark.parametrize("bad", ["../etc", "tg-nothing-here", "whatever"])
async def test_attach_unknown_is_one_line(no_leaks: Path, bad: str) -> None:
    with pytest.raises(ConfigError, match=f"^no kept sandbox {re.escape(bad)} "):
        await attach_sandbox("local", bad)


@pytest.mark.docker
@pytest.mark.slow
async def test_docker_check_keep_then_attach(tmp_path: Path) -> None:
    """check --keep --json on Docker: the record names the kept container; after the check process
    exited, attach enters it with the image's environment and working directory, and its remove
    command removes it alone; attach then fails in one line. (Not ``termgym gc --backend docker``
    without an id here: it removes every termgym container on the engine, other tests' too.)"""
    require_docker()
    from termgym.sandboxes.docker import docker_client
    from termgym.sandboxes.docker.containers import kept_names

    result = termgym(
        "check", TASK, "--agent", "oracle", "--keep", "--json", "--backend", "docker", cwd=tmp_path, timeout=600
    )
    assert result.returncode == 0, result.stderr
    kept = json.loads(result.stdout)["kept"]
    name = kept["id"]
    try:
        assert name.startswith("termgym-kept-")
        assert kept["attach"] == f"termgym shell --attach {name} --backend docker"
        assert kept["remove"] == f"termgym gc --backend docker {name}"
        assert name in kept_names()
        sandbox = await attach_sandbox("docker", name)
        assert (await sh(sandbox, "ls /app/reports")).split() == EXPECTED
        assert REPORTS & set((await sh(sandbox, "ls -A /logs/verifier")).split())
        assert (await sh(sandbox, "pwd")).strip() == sandbox.workdir
        await sandbox.check_alive()
        assert await keep(sandbox) == kept  # kept again, as it is
        await sandbox.stop()  # leaves it running
        again = await attach_sandbox("docker", name)
        assert (await sh(again, "cat /app/reports/2024-01-15_sales.csv")).startswith("report_date,2024-01-15")
        removed = termgym(*kept["remove"].split()[1:], cwd=tmp_path)
        assert removed.stdout.strip() == f"removed kept docker sandbox {name}", removed.stderr
    finally:
        with contextlib.suppress(Exception):
            docker_client().api.remove_container(name, force=True)
    assert name not in kept_names() and not [c for c in termgym_containers() if c.startswith(name)]
    with pytest.raises(ConfigError, match=f"^no kept sandbox {name} "):
        await attach_sandbox("docker", name)
