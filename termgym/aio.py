"""asyncio helpers for cancellation that neither gets lost nor leaves things half done.

``contextlib.suppress(BaseException)`` around ``await task`` after ``task.cancel()`` also swallows
a cancellation aimed at the *caller* (Ctrl-C, a timeout, the scheduler cancelling a trial) when it
arrives during that await, and the caller then carries on as if nothing happened.

CPython 3.11's ``asyncio.wait_for`` has the same flaw built in: when the awaited operation finishes
in the same loop iteration as the caller is cancelled, it returns the result and the cancellation
is lost; ``wait_for`` here does not.

Some operations must not be cancelled half-way either: on CPython 3.11, a cancellation that lands
inside ``asyncio.create_subprocess_exec`` (while it connects the pipes) kills only the direct
child and then waits for pipes that a surviving grandchild holds open, for ever.

Nor is ``asyncio.shield`` the way to make cleanup survive a cancellation: the cancellation reaches
the caller at once, while the shielded work (stopping a sandbox, removing its directory) goes on
unawaited, so a cancelled trial returned before its sandbox was gone; ``run_to_end`` waits for it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def cancel_and_wait(*tasks: asyncio.Future | None) -> None:
    """Cancel ``tasks`` (None entries skipped) and wait until every one has finished. Their own
    outcome (cancelled, or an error) stays with them and is marked retrieved; a cancellation of
    the caller while waiting propagates."""
    pending = [task for task in tasks if task is not None]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending)
    for task in pending:
        if not task.cancelled():
            task.exception()  # retrieved: no "exception was never retrieved" at exit


async def wait_for(awaitable: Awaitable[T], timeout: float) -> T:
    """``await awaitable``, cancelled and ``TimeoutError`` after ``timeout`` seconds; a cancellation
    of the caller always propagates (``asyncio.timeout``, not 3.11's ``asyncio.wait_for``)."""
    async with asyncio.timeout(timeout):
        return await awaitable


async def uninterrupted(work: Awaitable[T], undo: Callable[[T], Awaitable[None]]) -> T:
    """The result of ``work``, which a cancellation of the caller never interrupts midway. If the
    caller is cancelled meanwhile, ``work`` still runs to its end, ``undo`` is awaited on what it
    produced (uninterrupted too), and the cancellation then propagates: nothing is left half made."""
    task = asyncio.ensure_future(work)
    interrupted = await _wait_out(task)
    if not interrupted:
        return task.result()
    if task.exception() is None:
        cleanup = asyncio.ensure_future(undo(task.result()))
        await _wait_out(cleanup)
        if not cleanup.cancelled():
            cleanup.exception()  # retrieved: the cancellation is what propagates
    raise asyncio.CancelledError


async def run_to_end(work: Awaitable[T]) -> T:
    """The result of ``work`` (cleanup: a sandbox's stop, a shell's close), which a cancellation of
    the caller never interrupts and never leaves running behind it: if the caller is cancelled
    meanwhile, ``work`` is waited for to its end and the cancellation then propagates (whatever
    ``work`` raised is retrieved and dropped for it). Unlike ``asyncio.shield``, which propagates
    the cancellation at once and leaves ``work`` running unawaited."""
    task = asyncio.ensure_future(work)
    if not await _wait_out(task):
        return task.result()
    if not task.cancelled():
        task.exception()  # retrieved: the cancellation is what propagates
    raise asyncio.CancelledError


async def _wait_out(task: asyncio.Future) -> bool:
    """Wait until ``task`` is done, whatever cancellations arrive; True if any arrived."""
    interrupted = False
    while not task.done():
        try:
            await asyncio.wait({task})
        except asyncio.CancelledError:
            interrupted = True
    return interrupted


async def gather_limited(calls: Iterable[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Await every ``call()``, at most ``limit`` at once, started in order; the results in the
    order of ``calls``. The first exception propagates (as ``asyncio.gather`` does)."""
    gate = asyncio.Semaphore(max(1, limit))

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return list(await asyncio.gather(*(one(call) for call in calls)))
