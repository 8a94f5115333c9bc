"""An image's USER on the embedded backend (as root) and on Docker, on the same task: the agent's
commands and the verifier run as that user, the agent's files are that user's; a task without USER
runs both as root. The harness's own steps run as the sandbox's root, so an image whose /logs and
/tests are root's 0755 resolves too, unless the USER agent changed what those steps load (then they
run as the USER, with a warning)."""

from __future__ import annotations

import asyncio
import os

import pytest

from termgym.agents import ScriptedAgent
from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from tests.helpers import require_docker, write_task

BASE = "FROM termgym/base:bookworm\nRUN mkdir -p /logs /tests && chmod 1777 /logs /tests\n"
TEST_SH = """#!/bin/sh
said="$(id -u):$(id -g) $(stat -c %u:%g /tmp/agent-file)"
echo "$said"
[ "$said" = "{expected} {expected}" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""
USERS = {"nobody": ("USER nobody\n", "65534:65534"), "ids": ("USER 4242:4343\n", "4242:4343"), "none": ("", "0:0")}


@pytest.mark.skipif(os.geteuid() != 0, reason="the embedded backend honours USER as root only")
@pytest.mark.parametrize("user", USERS)
async def test_the_agent_and_the_verifier_run_as_the_images_user(tmp_path, backend, user, no_leaks):
    line, expected = USERS[user]
    task = load_task(write_task(tmp_path, dockerfile=BASE + line, test_sh=TEST_SH.format(expected=expected)))
    agent = ScriptedAgent(("touch /tmp/agent-file; echo $(id -u):$(id -g) $(stat -c %u:%g /tmp/agent-file)",))
    async with AsyncTerminalEnv(task, EnvOptions(backend=backend)) as env:
        await env.reset()
        observation, *_ = await env.step(agent.commands[0])
        _, reward, terminated, _, info = await env.step(SUBMIT)
    assert f"{expected} {expected}" in observation, observation
    assert terminated and info["resolved"] and reward > 0, info
    assert not [w for w in info.get("warnings") or () if "USER" in w], info


ROOTS = "FROM termgym/base:bookworm\nRUN mkdir -p /logs /tests && chmod 0755 /logs /tests\n"
# The verifier prints its ids, who made /logs/verifier (the harness's reset) and the mode of its
# home's parent (the home itself it writes: opened to it, the parent left closed), and resolves when
# they are what the case expects.
TEST_OWNER_SH = """#!/bin/sh
said="$(id -u) $(stat -c %u:%a /logs/verifier) $(touch "$HOME/x" && stat -c %a /tmp/.termgym-verifier)"
echo "$said"
[ "$said" = "{expected}" ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""
# A directory the image lets its USER write under /usr/lib, where the loader looks for libraries.
WRITABLE_LIB = "RUN mkdir /usr/lib/open && chmod 0777 /usr/lib/open\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="the embedded backend honours USER as root only")
async def test_the_harness_runs_as_root_under_a_user_whose_image_keeps_logs_and_tests_root_s(
    tmp_path, backend, no_leaks
):
    test_sh = TEST_OWNER_SH.format(expected="65534 0:777 755")
    task = load_task(write_task(tmp_path, dockerfile=ROOTS + "USER nobody\n", test_sh=test_sh))
    async with AsyncTerminalEnv(task, EnvOptions(backend=backend)) as env:
        await env.reset()
        await env.step("touch /tmp/agent-file")
        _, reward, terminated, _, info = await env.step(SUBMIT)
    assert terminated and info["resolved"] and reward > 0, info
    assert not [w for w in info.get("warnings") or () if "USER" in w], info


@pytest.mark.docker
@pytest.mark.parametrize("backend", ["docker"])  # the embedded backend's /usr is the host's, read-only
async def test_a_user_agent_that_changed_what_the_harness_loads_never_runs_as_root(tmp_path, backend, no_leaks):
    """The agent (nobody) puts a library where the loader looks (/usr/lib/open, its to write): the
    harness's steps then run as nobody, as before, and say so; its reset made /logs/verifier nobody's."""
    require_docker()
    test_sh = TEST_OWNER_SH.format(expected="65534 65534:777 755")
    dockerfile = BASE + WRITABLE_LIB + "USER nobody\n"  # /logs and /tests open to nobody
    task = load_task(write_task(tmp_path, dockerfile=dockerfile, test_sh=test_sh))
    async with AsyncTerminalEnv(task, EnvOptions(backend=backend)) as env:
        await env.reset()
        await env.step("cp /bin/true /usr/lib/open/libc.so.6")
        _, reward, terminated, _, info = await env.step(SUBMIT)
    assert terminated and info["resolved"] and reward > 0, info
    warned = [w for w in info.get("warnings") or () if "ran as USER nobody, not as root" in w]
    assert warned and "/usr/lib/open/libc.so.6" in warned[0], info


@pytest.mark.skipif(os.geteuid() != 0, reason="the embedded backend honours USER as root only")
async def test_without_user_the_harness_leaves_logs_verifier_closed(tmp_path, backend, no_leaks):
    task = load_task(write_task(tmp_path, dockerfile=ROOTS, test_sh=TEST_OWNER_SH.format(expected="0 0:755 755")))
    async with AsyncTerminalEnv(task, EnvOptions(backend=backend)) as env:
        await env.reset()
        _, reward, terminated, _, info = await env.step(SUBMIT)
    assert terminated and info["resolved"] and reward > 0, info


class _Listed:
    """What ``harness_user`` reads of a sandbox: its default user."""

    def __init__(self, user: str) -> None:
        self.default_user = user


def _changes(changes: dict[str, str] | None) -> asyncio.Future:
    listed: asyncio.Future = asyncio.get_running_loop().create_future()
    listed.set_result(changes)
    return listed


@pytest.mark.parametrize(
    ("user", "changes", "expected"),
    [
        ("", None, "0"),  # root's image: root, and the listing is never awaited
        ("root:staff", None, "0"),
        ("nobody", {"/tmp/x": "A", "/home/n/.cache/y.pyc": "A", "/usr/lib/gone.so": "D"}, "0"),
        ("nobody", {"/usr/lib/x86_64-linux-gnu/libc.so.6": "C"}, None),
        ("1000:1000", {"/etc/ld.so.preload": "A"}, None),
        ("nobody", {"/bin": "C"}, None),
        ("nobody", None, None),  # its changes cannot be listed: the worst is assumed
    ],
)
async def test_who_runs_the_harness_steps(user, changes, expected):
    from termgym.episode.verification import harness_user

    chosen, warning = await harness_user(_Listed(user), _changes(changes))  # type: ignore[arg-type]
    assert chosen == expected and bool(warning) == (expected is None)
