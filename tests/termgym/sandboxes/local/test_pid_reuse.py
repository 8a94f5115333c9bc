"""A sandbox never ends another's through a pid that is no longer its own: once a sandbox's keeper
has died (killed from the host: no process of the sandbox can signal it, its namespace's init) and
its bubblewrap was reaped, that pid may be
another process's, here the keeper of another sandbox (another trial's, or another run's on the
same machine: pids wrap quickly under a process storm). Stopping the first must leave the second
running."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from termgym.errors import SandboxBroken
from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.local import LocalSandbox
from termgym.sandboxes.local.keeper import Keeper

NEXT_PID = Path("/proc/sys/kernel/ns_last_pid")  # the pid the kernel gave last; the next one gets it + 1
pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not os.access(NEXT_PID, os.W_OK), reason="choosing the next pid needs root"
)


async def broken_sandbox() -> tuple[LocalSandbox, int]:
    """A started sandbox whose keeper was killed from the host, and the pid its keeper's bubblewrap
    had, once reaped."""
    sandbox = LocalSandbox(SandboxSpec("broken", None, None))
    await sandbox.start()
    assert sandbox._keeper is not None and sandbox._keeper.process is not None
    bwrap, keeper = sandbox._keeper.process, sandbox._keeper.pid
    assert keeper is not None
    os.kill(keeper, signal.SIGKILL)
    for _ in range(250):
        if bwrap.returncode is not None:
            break
        await asyncio.sleep(0.02)
    assert bwrap.returncode is not None, "the broken sandbox's bubblewrap was never reaped"
    with pytest.raises(SandboxBroken):
        await sandbox.exec(["/bin/true"], timeout=10)
    return sandbox, bwrap.pid


async def test_stopping_a_broken_sandbox_leaves_the_sandbox_that_took_its_keepers_pid(
    no_leaks: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix the stop killed the children of whatever held the pid of its reaped bubblewrap:
    here the other sandbox's namespace, whose next command then found its keeper gone."""
    start = Keeper.start
    for _ in range(5):  # another process of this machine may take the freed pid first: again
        broken, freed = await broken_sandbox()
        other = LocalSandbox(SandboxSpec("other", None, None))

        async def start_at_the_freed_pid(keeper: Keeper, freed: int = freed) -> None:
            NEXT_PID.write_text(str(freed - 1))
            await start(keeper)

        monkeypatch.setattr(Keeper, "start", start_at_the_freed_pid)
        try:
            await other.start()
        finally:
            monkeypatch.setattr(Keeper, "start", start)
            await broken.stop()
        try:
            assert other._keeper is not None and other._keeper.process is not None
            if other._keeper.process.pid != freed:
                continue
            await other.check_alive()  # SandboxBroken before the fix
            result = await other.exec(["/bin/sh", "-c", "echo alive"], timeout=10)
            assert (result.exit_code, result.text) == (0, "alive\n")
            return
        finally:
            await other.stop()
    pytest.fail("no sandbox's keeper took the freed pid in 5 tries (this machine forks too busily)")
