from __future__ import annotations

import asyncio
import time

import pytest

from termgym.sandboxes.pacing import Pacer, max_in_any_window
from termgym.scheduling import simclock


def test_an_hour_of_sleep_takes_no_real_time():
    async def main() -> float:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(3600)
        return loop.time()

    started = time.monotonic()
    assert simclock.run(main()) == pytest.approx(3600.0)
    assert time.monotonic() - started < 1.0


def test_timers_fire_in_order_at_their_virtual_times():
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        fired: list[tuple[str, float]] = []
        for name, delay in [("c", 30.0), ("a", 0.5), ("b", 7.25), ("a2", 0.5)]:
            loop.call_later(delay, lambda n=name: fired.append((n, loop.time())))
        await asyncio.sleep(31)
        return fired

    assert simclock.run(main()) == [("a", 0.5), ("a2", 0.5), ("b", 7.25), ("c", 30.0)]


def test_ready_work_runs_before_the_clock_moves():
    async def main() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        timer = asyncio.ensure_future(asyncio.sleep(5))
        for _ in range(1000):  # a long chain of ready callbacks with a timer pending
            await asyncio.sleep(0)
        during = loop.time()
        await timer
        return during, loop.time()

    assert simclock.run(main()) == (0.0, 5.0)


def test_wait_for_times_out_on_the_virtual_clock():
    async def main() -> float:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(100), 12.5)
        return loop.time()

    assert simclock.run(main()) == pytest.approx(12.5)


def test_threads_still_complete_when_no_timer_is_pending():
    async def main() -> tuple[str, float]:
        loop = asyncio.get_running_loop()
        result = await asyncio.to_thread(lambda: time.sleep(0.05) or "done")
        return result, loop.time()

    assert simclock.run(main()) == ("done", 0.0)


def test_start_time_and_a_clock_that_never_goes_backwards():
    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        seen = [loop.time()]
        for delay in (3, 0, 1e-6, 2):
            await asyncio.sleep(delay)
            seen.append(loop.time())
        assert isinstance(loop, simclock.VirtualTimeLoop)
        loop.advance(-5)  # ignored
        seen.append(loop.time())
        return seen

    seen = simclock.run(main(), start=100.0)
    assert seen[0] == 100.0 and seen == sorted(seen) and seen[-1] == pytest.approx(105.000001)


def test_the_pacer_paces_virtual_time_exactly():
    async def main() -> list[float]:
        pacer = Pacer()  # 6/s and 600/min
        return list(await asyncio.gather(*(pacer.acquire() for _ in range(560))))

    grants = simclock.run(main())
    assert max(grants) == pytest.approx(93.0)  # 6 per second: grant k at floor(k / 6)
    assert max_in_any_window(grants, 1.0) == 6
