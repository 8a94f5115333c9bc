"""Pacing of sandbox creation: at most N grants in any window of T seconds, for several windows at once.

Defaults follow the published set-up: 6 per second and 600 per minute, both enforced together. The
rule is a sliding window over the times of earlier grants: a grant at time t is allowed when fewer
than ``limit`` grants fall in ``(t - period, t]`` for every window. ``next_grant_time`` is that rule as
a pure function; ``Pacer`` applies it, one grant at a time, first come first served, on the event
loop's clock (so a simulated clock paces simulated time).

Why not ``asyncio-throttle``: its Throttler reads ``time.monotonic`` directly (no virtual clock),
polls every 10 ms, and two nested Throttlers record their timestamps at different moments, so the
pair can exceed the outer window by a few grants. Retries must call ``acquire`` again: every
attempt to create is a grant.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from termgym.errors import ConfigError

DEFAULT_PER_SECOND = 6
DEFAULT_PER_MINUTE = 600


@dataclass(frozen=True)
class Window:
    limit: int
    period: float

    def __post_init__(self) -> None:
        if self.limit < 1 or self.period <= 0:
            raise ConfigError(f"a pacing window needs limit >= 1 and period > 0, got {self.limit}/{self.period}s")


def default_windows(per_second: int = DEFAULT_PER_SECOND, per_minute: int = DEFAULT_PER_MINUTE) -> tuple[Window, ...]:
    return (Window(per_second, 1.0), Window(per_minute, 60.0))


def next_grant_time(history: Sequence[float], windows: Sequence[Window], now: float) -> float:
    """The earliest time >= ``now`` at which one more grant keeps every window within its limit.

    ``history`` holds earlier grant times in ascending order, none after ``now``."""
    earliest = now
    for window in windows:
        if len(history) >= window.limit:
            earliest = max(earliest, history[-window.limit] + window.period)
    return earliest


def max_in_any_window(times: Sequence[float], period: float) -> int:
    """The largest number of ``times`` inside any half-open window ``(t - period, t]``."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, time in enumerate(ordered):
        while ordered[start] <= time - period:
            start += 1
        best = max(best, end - start + 1)
    return best


class Pacer:
    """Grants creation slots one at a time under every window; share one per provider quota. With
    no window (``Pacer(())``) every request is granted at once, in turn."""

    def __init__(self, windows: Sequence[Window] | None = None) -> None:
        self.windows = tuple(windows if windows is not None else default_windows())
        self._history: deque[float] = deque(maxlen=max((w.limit for w in self.windows), default=0))
        self._lock = asyncio.Lock()
        self.granted = 0

    async def acquire(self) -> float:
        """Wait for a slot; returns the (loop) time it was granted. A cancelled wait grants nothing."""
        loop = asyncio.get_running_loop()
        async with self._lock:
            while True:
                now = loop.time()
                due = next_grant_time(self._history, self.windows, now)
                if due <= now:
                    break
                await asyncio.sleep(due - now)
            self._history.append(now)
            self.granted += 1
            return now
