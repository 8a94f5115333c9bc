"""termgym's shared loop for synchronous callers: results and errors come back, a wait that ends
early cancels the coroutine and waits for its cleanup, and the loop never waits on itself."""

from __future__ import annotations

import asyncio
import threading

import pytest

from termgym.integrations import sync_loop


async def answer(value: int) -> int:
    await asyncio.sleep(0)
    return value


async def fail() -> None:
    raise ValueError("from the loop")


def test_results_and_errors_come_back_from_any_thread():
    assert sync_loop.run(answer(7)) == 7
    with pytest.raises(ValueError, match="from the loop"):
        sync_loop.run(fail())
    results: list[int] = []
    threads = [threading.Thread(target=lambda i=i: results.append(sync_loop.run(answer(i)))) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [0, 1, 2, 3]


def test_a_wait_that_times_out_cancels_the_coroutine_after_its_cleanup():
    cleaned = threading.Event()

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.2)  # cleanup that takes a while (a sandbox stopping)
            cleaned.set()

    with pytest.raises(TimeoutError):
        sync_loop.run(slow(), timeout=0.1)
    assert cleaned.is_set()  # run() returned only once the cleanup had finished


def test_the_loop_never_waits_on_itself():
    async def inner() -> str:
        pending = answer(1)
        try:
            sync_loop.run(pending)
        except RuntimeError as exc:
            return str(exc)
        return "no error"

    assert "cannot wait on itself" in sync_loop.run(inner())


def test_a_tracked_resource_is_closed_at_exit_unless_untracked():
    closed: list[str] = []

    class Resource:
        def __init__(self, name: str) -> None:
            self.name = name

        async def aclose(self) -> None:
            closed.append(self.name)

    kept, dropped = Resource("kept"), Resource("dropped")
    sync_loop.track(kept)
    sync_loop.track(dropped)
    sync_loop.untrack(dropped)
    assert kept in sync_loop._open and dropped not in sync_loop._open
    sync_loop.untrack(kept)
