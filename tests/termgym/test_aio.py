"""``cancel_and_wait``: the inner tasks are cancelled and awaited, and a cancellation aimed at the
caller while it waits is never swallowed (the bug behind Ctrl-C being ignored)."""

from __future__ import annotations

import asyncio

import pytest

from termgym.aio import cancel_and_wait


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
