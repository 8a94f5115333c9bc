"""The embedded backend's host processes: their ends are watched without a thread each, on
whichever loop started them."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading

import pytest

from termgym.sandboxes.host_processes import end_process, exited, spawn

pytestmark = pytest.mark.skipif(sys.version_info >= (3, 12), reason="3.12's own watcher uses pidfds")


async def _sleepers(count: int) -> list[asyncio.subprocess.Process]:
    return [await spawn(["sleep", "60"], end_process) for _ in range(count)]


async def test_live_children_hold_no_thread_each():
    """Twenty live children: no thread more than one child holds (3.11's default watcher holds one
    per child)."""
    first = await _sleepers(1)
    before = threading.active_count()
    more = await _sleepers(19)
    try:
        assert threading.active_count() == before
        assert type(asyncio.get_child_watcher()).__name__ == "_PidfdWatcher"
    finally:
        for process in first + more:
            await end_process(process)
    assert all(process.returncode == -signal.SIGKILL for process in first + more)


async def test_exit_codes_and_signals_reach_the_caller():
    done = await spawn(["sh", "-c", "exit 7"], end_process)
    killed = await spawn(["sleep", "60"], end_process)
    os.kill(killed.pid, signal.SIGTERM)
    assert await exited(done, 10) and await exited(killed, 10)
    assert (done.returncode, killed.returncode) == (7, -signal.SIGTERM)
    await end_process(done)
    await end_process(killed)


def test_a_loop_in_another_thread_sees_its_childrens_ends():
    """The watcher follows the loop that started the child, not the main thread's."""
    seen: list[int | None] = []

    async def in_thread() -> None:
        process = await spawn(["sh", "-c", "exit 3"], end_process)
        await asyncio.wait_for(process.wait(), 10)
        seen.append(process.returncode)

    worker = threading.Thread(target=lambda: asyncio.run(in_thread()))
    worker.start()
    worker.join(30)
    assert seen == [3]
