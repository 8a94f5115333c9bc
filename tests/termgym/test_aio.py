"""Cancellation that is neither lost nor leaves things half done: ``cancel_and_wait`` (a
cancellation aimed at the caller while it waits is never swallowed: the bug behind Ctrl-C being
ignored), ``wait_for``, ``uninterrupted``, ``run_to_end`` (cleanup that a cancelled caller waits
for: the sandbox directories a cancelled trial left), and the embedded backend's spawning of
processes (the hang behind a trial that never ended after the scheduler cancelled it)."""

from __future__ import annotations

import asyncio
import os
import re
import time

import pytest

from termgym.aio import cancel_and_wait, run_to_end, uninterrupted, wait_for
from termgym.sandboxes.host_processes import end_entered as _end_entered
from termgym.sandboxes.host_processes import spawn as _spawn
from tests.helpers import pids_matching


async def test_inner_tasks_end_and_their_errors_are_retrieved():
    async def fails():
        raise RuntimeError("inner")

    async def sleeps():
        await asyncio.sleep(30)

    failing, sleeping = asyncio.create_task(fails()), asyncio.create_task(sleeps())
    await asyncio.sleep(0)
    await cancel_and_wait(failing, None, sleeping)
    assert sleeping.cancelled() and isinstance(failing.exception(), RuntimeError)


async def test_a_cancellation_of_the_caller_while_waiting_propagates():
    async def stubborn():  # takes a while to unwind after being cancelled
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.shield(asyncio.sleep(0.3))

    inner = asyncio.create_task(stubborn())
    await asyncio.sleep(0)

    async def closer():
        await cancel_and_wait(inner)
        return "carried on"

    outer = asyncio.create_task(closer())
    await asyncio.sleep(0.05)  # the closer is now waiting for the inner task to unwind
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    await asyncio.wait([inner])


# -- wait_for: CPython 3.11's loses a cancellation that coincides with the result -----------------


async def test_wait_for_never_loses_a_cancellation_that_coincides_with_the_result():
    result = asyncio.get_running_loop().create_future()

    async def caller():
        await wait_for(result, 10)
        return "carried on"

    task = asyncio.create_task(caller())
    await asyncio.sleep(0)  # the caller is now waiting
    result.set_result("done")
    task.cancel()  # in the same loop iteration: asyncio.wait_for on 3.11 returns "done" here
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_wait_for_times_out_and_returns_results():
    assert await wait_for(asyncio.sleep(0, "value"), 1) == "value"
    began = time.monotonic()
    with pytest.raises(TimeoutError):
        await wait_for(asyncio.sleep(30), 0.1)
    assert time.monotonic() - began < 5


# -- uninterrupted: what is being made is finished, then undone, on cancellation --------------------


async def test_uninterrupted_finishes_the_work_undoes_it_and_propagates_the_cancellation():
    made, undone = [], []

    async def make():
        await asyncio.sleep(0.2)
        made.append("resource")
        return "resource"

    async def undo(resource):
        await asyncio.sleep(0.1)
        undone.append(resource)

    task = asyncio.create_task(uninterrupted(make(), undo))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.sleep(0.2)
    task.cancel()  # a second cancellation, while undoing, does not cut the undo short either
    with pytest.raises(asyncio.CancelledError):
        await task
    assert made == ["resource"] and undone == ["resource"]


async def test_uninterrupted_without_cancellation_returns_and_keeps_errors():
    async def undo(_):
        raise AssertionError("nothing to undo")

    assert await uninterrupted(asyncio.sleep(0.01, "value"), undo) == "value"

    async def fails():
        raise OSError("no such program")

    with pytest.raises(OSError, match="no such program"):
        await uninterrupted(fails(), undo)


# -- run_to_end: cleanup the cancelled caller waits for (asyncio.shield leaves it running) ---------


async def test_run_to_end_finishes_the_work_before_the_cancellation_propagates():
    finished = []

    async def cleanup():
        await asyncio.sleep(0.3)
        finished.append("cleaned up")

    task = asyncio.create_task(run_to_end(cleanup()))
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.sleep(0.05)
    task.cancel()  # a second cancellation does not cut the work short either
    with pytest.raises(asyncio.CancelledError):
        await task
    assert finished == ["cleaned up"]  # asyncio.shield: the caller is cancelled first, the work still running


async def test_run_to_end_without_cancellation_returns_and_raises_as_the_work_does():
    assert await run_to_end(asyncio.sleep(0.01, "value")) == "value"

    async def fails():
        raise OSError("busy")

    with pytest.raises(OSError, match="busy"):
        await run_to_end(fails())


# -- the embedded backend's processes: a cancelled spawn leaves nothing behind ----------------------


@pytest.mark.parametrize("yields", [0, 1, 2, 3])
async def test_a_spawn_cancelled_half_way_ends_the_process_and_what_it_started(yields):
    # The child leaves a grandchild holding the output pipe, as nsenter leaves the sandbox's shell:
    # plain create_subprocess_exec, cancelled while connecting the pipes, then waits for it.
    marker = f"{30 + yields}.{os.getpid()}"
    spawning = asyncio.create_task(
        _spawn(
            ["sh", "-c", f"sleep {marker} & exec sleep {marker}"],
            _end_entered,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    )
    for _ in range(yields):
        await asyncio.sleep(0)
    spawning.cancel()
    async with asyncio.timeout(10):
        with pytest.raises(asyncio.CancelledError):
            await spawning
    deadline = time.monotonic() + 5
    while pids_matching(re.escape(marker)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not pids_matching(re.escape(marker))
