"""A virtual-time asyncio event loop: simulated minutes pass in milliseconds of real time.

``VirtualTimeLoop`` is the standard selector loop with one change: its clock (``loop.time()``)
is a number the loop advances itself. Whenever the loop would block waiting for its next timer
and no real I/O is ready, it jumps the clock to that timer instead of sleeping. Everything built
on the loop's clock, ``asyncio.sleep``, ``wait_for``, ``call_later``, ``termgym.sandboxes.pacing.Pacer``,
then runs unchanged, in simulated time. ``run(coro)`` is ``asyncio.run`` on such a loop.

Guaranteed: timers fire in the order a real loop fires them, at exactly their scheduled times;
the clock never goes backwards; ready callbacks and ready I/O always run before the clock moves;
with no timer pending the loop blocks on real I/O as usual (so work handed to threads completes).

Not guaranteed: real I/O and threads do not advance the clock and the clock does not wait for
them. While a timer is pending, an unfinished thread or subprocess is simply overtaken by virtual
time, so use this loop for code whose waiting is all on the loop's clock (simulations, tests of
pacing and timeouts), not for real sandboxes. ``time.monotonic()`` and ``time.time()`` are the real
clocks and are unaffected.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class _VirtualSelector(selectors.DefaultSelector):
    """Answers "wait up to t seconds" by polling real I/O once, then moving the loop's clock by t."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list:
        if timeout is None:  # no timer pending: only real I/O can wake the loop
            return super().select(None)
        events = super().select(0)
        if not events and timeout > 0:
            self._loop.advance(timeout)
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """A selector event loop whose ``time()`` is virtual and jumps to the next timer when idle."""

    def __init__(self, start: float = 0.0) -> None:
        self._virtual_now = float(start)
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (never backwards)."""
        if seconds > 0:
            self._virtual_now += seconds


def run(coro: Coroutine[Any, Any, T], *, start: float = 0.0) -> T:
    """Run ``coro`` to completion on a fresh ``VirtualTimeLoop`` (what ``asyncio.run`` does, on
    virtual time): tasks left over are cancelled, async generators and executors shut down."""
    with asyncio.Runner(loop_factory=lambda: VirtualTimeLoop(start)) as runner:
        return runner.run(coro)
