from __future__ import annotations

import asyncio
import random
import re

import pytest

from termgym.sandboxes.pacing import Pacer, Window, default_windows, max_in_any_window, next_grant_time

SECOND, MINUTE = default_windows()


@pytest.mark.parametrize(
    ("history", "now", "expected"),
    [
        ([], 5.0, 5.0),
        ([0.0, 0.1, 0.2, 0.3, 0.4], 0.5, 0.5),  # 5 in the last second: a 6th fits
        ([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], 0.6, 1.0),  # 6 in the last second: wait for the oldest to leave
        ([0.0, 0.1, 0.2, 0.3, 0.4, 0.5], 2.0, 2.0),
        ([0.5 + i * 0.1 for i in range(600)], 60.6, 60.9),  # the minute has room again; the second does not
    ],
)
def test_next_grant_time_table(history, now, expected):
    assert next_grant_time(history, (SECOND, MINUTE), now) == pytest.approx(expected)


def test_minute_window_binds_when_second_window_would_allow():
    history = [i * 0.1 for i in range(600)]  # 10/s for 60 s, allowed by a 20/s window
    assert next_grant_time(history, (Window(20, 1.0), MINUTE), 59.95) == pytest.approx(60.0)


@pytest.mark.parametrize(
    ("times", "period", "expected"),
    [([], 1.0, 0), ([0, 0.5, 0.99], 1.0, 3), ([0, 0.5, 1.0], 1.0, 2), ([0, 1, 2, 3], 1.0, 1), ([0, 0, 0], 1.0, 3)],
)
def test_max_in_any_window(times, period, expected):
    assert max_in_any_window(times, period) == expected


def test_windows_are_validated():
    with pytest.raises(ValueError, match=re.escape("a pacing window needs limit >= 1 and period > 0, got 0/1.0s")):
        Window(0, 1.0)
    with pytest.raises(ValueError, match=re.escape("a pacing window needs limit >= 1 and period > 0, got 3/0s")):
        Window(3, 0)


async def test_pacer_never_exceeds_either_window_under_a_burst():
    pacer = Pacer((Window(5, 0.2), Window(12, 1.0)))
    random.seed(1)

    async def client() -> float:
        await asyncio.sleep(random.random() * 0.05)
        return await pacer.acquire()

    times = await asyncio.gather(*(client() for _ in range(30)))
    assert max_in_any_window(times, 0.2) <= 5
    assert max_in_any_window(times, 1.0) <= 12
    assert max(times) - min(times) >= 2.0 - 0.05  # 30 grants at 12/s need at least two full windows
    assert pacer.granted == 30


async def test_cancelled_wait_grants_nothing():
    pacer = Pacer((Window(1, 10.0),))
    await pacer.acquire()
    waiter = asyncio.create_task(pacer.acquire())
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pacer.granted == 1


async def test_a_pacer_without_windows_grants_a_burst_at_once():
    pacer = Pacer(())
    loop = asyncio.get_running_loop()
    began = loop.time()
    times = await asyncio.gather(*(pacer.acquire() for _ in range(50)))
    assert max(times) - began < 0.5  # 50 grants at the default 6/s would take over 8 s
    assert pacer.granted == 50
