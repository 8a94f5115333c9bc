"""Red team, the embedded backend: descriptors of the process that starts a sandbox, as an agent in
the sandbox reaches for them.

On a Ray node the sandbox's actor is async, so Ray runs it on uvloop, whose ``subprocess_exec``
ignores ``close_fds``: every sandbox inherited the worker's descriptors, and an agent appended to
the host's raylet and worker logs through ``/proc/self/fd`` (and wrote past its storage limit).
Here a host "log" is open without close-on-exec, a sandbox is started under asyncio's own loop and
under uvloop, and the agent lists and writes its descriptors: in its commands (``exec``), in the
persistent shell of an episode, and, from the host, in every process the sandbox runs (its keeper
and spare keeper, every command entered).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop

from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.sandboxes.host_processes import children
from termgym.sandboxes.local.commands import GUARD_SCRIPTS, within_limits
from termgym.tasks import load_task

pytestmark = [pytest.mark.redteam]
LOOPS = {"asyncio": asyncio.new_event_loop, "uvloop": uvloop.new_event_loop}


def still_starting(pid: int) -> bool:
    """Whether ``pid`` has not yet reached its guard's ``close_range``: a fork of this process that
    has not run its program yet, or the guard itself (perl, running ``within_limits``'s script).
    Nothing in the sandbox reaches either; what the guard runs next is checked like any process."""
    perl = within_limits(["true"], [], None)[:2]
    with open(f"/proc/{pid}/cmdline", "rb") as file:
        argv = file.read().decode(errors="replace").split("\0")[:-1]
    with open("/proc/self/cmdline", "rb") as file:
        own = file.read().decode(errors="replace").split("\0")[:-1]
    return argv == own or (argv[:2] == perl and len(argv) > 2 and argv[2] in GUARD_SCRIPTS)


def holders(log: Path) -> list[str]:
    """Every process this one started, however deep, that holds ``log`` open ("pid fd"), but for
    those still starting (``still_starting``: the spare keeper, say, may be starting meanwhile)."""
    target = log.stat()
    found, queue = [], [os.getpid()]
    while queue:
        for pid in children(queue.pop()):
            queue.append(pid)
            with contextlib.suppress(OSError):  # a process that ended meanwhile
                if still_starting(pid):
                    continue
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        held = os.stat(f"/proc/{pid}/fd/{fd}")
                        if (held.st_dev, held.st_ino) == (target.st_dev, target.st_ino):
                            found.append(f"{pid} {fd}")
    return found


LIST = "ls /proc/self/fd; echo --; ls /proc/$$/fd"  # the listing's own, then its shell's


async def episode(task_dir: Path, fd: int, log: Path) -> tuple[list[str], list[str]]:
    """An episode's persistent shell, then its sandbox's ``exec``, list their descriptors and write
    to ``fd``; meanwhile, which of the sandbox's processes (keepers, shell, command) hold ``log``.
    Returns the two listings and the holders."""
    write = f"echo owned >> /proc/self/fd/{fd}; echo owned >> /proc/$$/fd/{fd}"
    async with AsyncTerminalEnv(load_task(task_dir), EnvOptions(max_turns=3)) as env:
        await env.reset()
        assert env.sandbox is not None and env.sandbox.backend == "local"
        in_shell, *_ = await env.step(LIST)
        await env.step(write)
        held = holders(log)
        await env.sandbox.exec(["/bin/sh", "-c", write], timeout=10)
        command = asyncio.ensure_future(env.sandbox.exec(["/bin/sh", "-c", f"{LIST}; sleep 1"], timeout=10))
        await asyncio.sleep(0.5)
        held += holders(log)
        return [in_shell, (await command).text], held


@pytest.mark.parametrize("loop", LOOPS.values(), ids=LOOPS.keys())
def test_no_descriptor_of_the_host_reaches_a_sandbox(
    task_dir: Path, no_leaks, tmp_path: Path, loop: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    log = tmp_path / "host.log"
    opened = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    fd = fcntl.fcntl(opened, fcntl.F_DUPFD, 100)  # inheritable, as the raylet's and the worker's logs were
    os.close(opened)
    assert os.get_inheritable(fd)
    try:
        with asyncio.Runner(loop_factory=loop) as runner:
            listings, held = runner.run(episode(task_dir, fd, log))
    finally:
        os.close(fd)
    assert held == [], held  # not the keeper, its spare, the shell, nor a command while it runs
    assert log.read_text() == "", listings
    for listing in listings:
        own, shells = (sorted(map(int, part.split())) for part in listing.split("--")[:2])
        assert own == [0, 1, 2, 3], listing  # 3: ls's own, on the directory it lists
        # the shell's: bash also keeps the descriptors a redirection in force saved, and the frame's
        assert fd not in shells and shells[:3] == [0, 1, 2], listing
