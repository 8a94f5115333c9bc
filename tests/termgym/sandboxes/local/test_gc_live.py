"""``termgym gc`` (``collect_garbage``) never touches a live process's sandbox, whatever its state
(starting: directory and labels made, no keeper yet; idle: every process ended by the kill step, no
keeper until the next command) and whatever state directory it scans (its own, or another one,
as a test or a run with another ``TERMGYM_SANDBOX_DIR`` does), and still removes what a killed run
left, its cgroups too, even where its directory is gone."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.local import LocalSandbox, collect_garbage
from termgym.sandboxes.local.keeper import Keeper
from termgym.sandboxes.local.startup import Processes

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a sandbox's cgroups need root")


@pytest.fixture
def other_root() -> Iterator[Path]:
    """Another state directory, as another run's or a test's ``collect_garbage(root)`` scans."""
    root = Path(tempfile.mkdtemp(prefix="termgym-test-other-root-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def cgroup_dirs(sandbox: LocalSandbox) -> list[Path]:
    cgroup = sandbox._cgroup
    assert cgroup is not None, f"no cgroup on this host as root: {sandbox.warnings}"
    return sorted({directory for _, directory in cgroup.dirs.values()})


async def make_idle(sandbox: LocalSandbox) -> None:
    """The kill step with no spare to take over: every process ended, no keeper (``IDLE``)."""
    assert sandbox._keeper is not None
    await sandbox._keeper.discard_spare()
    await sandbox.kill_agent_processes()
    assert sandbox._state is Processes.IDLE
    cgroup = sandbox._cgroup
    assert cgroup is not None and not cgroup.pids()  # empty: what gc took for a dead run's


async def still_works(sandbox: LocalSandbox) -> None:
    assert sandbox.host_dir is not None and (sandbox.host_dir / "labels.json").exists()
    cgroups = cgroup_dirs(sandbox)
    assert all(c.is_dir() for c in cgroups), [str(c) for c in cgroups if not c.is_dir()]
    result = await sandbox.exec(["/bin/sh", "-c", "echo alive > /app/a; cat /app/a"], timeout=30)
    assert (result.exit_code, result.text) == (0, "alive\n")


@pytest.mark.parametrize("scanned", ["own root", "other root"])
async def test_gc_leaves_a_starting_sandbox(
    no_leaks: Path, other_root: Path, scanned: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gc runs between the sandbox's directory, labels and cgroups being made and its keeper's start
    (no ``keeper.pid`` yet, its cgroups empty): before the fix it removed the directory (own root) or
    the cgroups (any root), and the keeper failed to join its cgroup."""
    root = no_leaks if scanned == "own root" else other_root
    removed: list[int] = []
    start = Keeper.start

    async def gc_then_start(keeper: Keeper) -> None:
        if not removed:
            assert not (keeper._pid_file).exists()
            removed.append(await asyncio.to_thread(collect_garbage, root))
        await start(keeper)

    monkeypatch.setattr(Keeper, "start", gc_then_start)
    sandbox = LocalSandbox(SandboxSpec("gc-starting", None, None))
    async with sandbox:
        assert removed == [0]
        await still_works(sandbox)


@pytest.mark.parametrize("scanned", ["own root", "other root"])
async def test_gc_leaves_an_idle_sandbox(no_leaks: Path, other_root: Path, scanned: str) -> None:
    """gc runs while the sandbox is idle after the kill step (its keeper ended, ``keeper.pid``
    naming a dead process, its cgroups empty): the next command starts a keeper in its cgroups."""
    root = no_leaks if scanned == "own root" else other_root
    sandbox = LocalSandbox(SandboxSpec("gc-idle", None, None))
    async with sandbox:
        await make_idle(sandbox)
        assert await asyncio.to_thread(collect_garbage, root) == 0
        await still_works(sandbox)


LIVE_SCRIPT = """
import asyncio, sys
from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.local import LocalSandbox
async def main():
    sandbox = LocalSandbox(SandboxSpec('gc-other-process', None, None))
    await sandbox.start()
    await sandbox._keeper.discard_spare()
    await sandbox.kill_agent_processes()
    print(sandbox.host_dir, *sandbox._cgroup.procs_files, flush=True)
    if sys.argv[1] == 'wait':
        await asyncio.to_thread(sys.stdin.readline)
        result = await sandbox.exec(['/bin/sh', '-c', 'echo ok'], timeout=30)
        print(result.exit_code, result.text.strip(), flush=True)
        await sandbox.stop()
    else:
        await asyncio.sleep(600)
asyncio.run(main())
"""


async def idle_in_subprocess(mode: str) -> tuple[asyncio.subprocess.Process, Path, list[Path]]:
    """A process of its own with an idle sandbox: (the process, its directory, its cgroups)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", LIVE_SCRIPT, mode, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    line = (await asyncio.wait_for(process.stdout.readline(), 60)).decode().split()
    assert line, "the sandbox did not start"
    host_dir, *procs = line
    return process, Path(host_dir), [Path(p).parent for p in procs]


async def test_gc_leaves_another_process_idle_sandbox(no_leaks: Path, other_root: Path) -> None:
    """Another process's idle sandbox (as another pytest session's or run's) survives gc over its
    state directory and over another one; its next command runs."""
    process, host_dir, cgroups = await idle_in_subprocess("wait")
    assert process.stdin is not None and process.stdout is not None
    try:
        assert await asyncio.to_thread(collect_garbage, other_root) == 0
        assert await asyncio.to_thread(collect_garbage, no_leaks) == 0
        assert host_dir.is_dir() and cgroups and all(c.is_dir() for c in cgroups)
        process.stdin.write(b"go\n")
        await process.stdin.drain()
        assert (await asyncio.wait_for(process.stdout.readline(), 60)).decode().split() == ["0", "ok"]
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
            collect_garbage(no_leaks)


async def killed(mode: str = "sleep") -> tuple[Path, list[Path]]:
    """A run killed (``SIGKILL``) while its sandbox was idle: its directory and cgroups, once empty."""
    process, host_dir, cgroups = await idle_in_subprocess(mode)
    process.send_signal(signal.SIGKILL)
    await process.wait()
    for _ in range(500):  # the kernel reaps its last processes (none: it was idle) asynchronously
        if not any((c / "cgroup.procs").read_text().strip() for c in cgroups):
            break
        await asyncio.sleep(0.02)
    return host_dir, cgroups


async def test_gc_removes_a_killed_run_and_its_orphaned_cgroups_not_a_live_one(
    no_leaks: Path, other_root: Path
) -> None:
    """A killed run's idle sandbox goes (directory and cgroups) beside a live idle one in the same
    state directory; a killed run's cgroups whose directory is gone go too, from gc over another
    state directory, and the live sandbox's stay."""
    live = LocalSandbox(SandboxSpec("gc-live", None, None))
    async with live:
        await make_idle(live)
        dead_dir, dead_cgroups = await killed()
        assert dead_dir.is_dir() and dead_cgroups and all(c.is_dir() for c in dead_cgroups)
        assert await asyncio.to_thread(collect_garbage, no_leaks) == 1
        assert not dead_dir.exists() and not any(c.exists() for c in dead_cgroups)
        orphan_dir, orphan_cgroups = await killed()
        shutil.rmtree(orphan_dir)  # its state directory was wiped: only the cgroups are left
        assert all(c.is_dir() for c in orphan_cgroups)
        assert await asyncio.to_thread(collect_garbage, other_root) == 0
        assert not any(c.exists() for c in orphan_cgroups)
        await still_works(live)
