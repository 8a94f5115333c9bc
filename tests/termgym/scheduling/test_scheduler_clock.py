"""The scheduler's ``work`` clock: which trials a step keeps is decided by what they did (their
work, in launch order on the nodes' slots), never by when they happened to end. Each test injects
delays that reorder the ends, on a virtual clock, and checks the kept set does not move."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from termgym.records import TrialRecord
from termgym.sandboxes.pacing import Pacer, Window
from termgym.scheduling import bias, simclock
from termgym.scheduling.pool import TaskPool, make_nodes
from termgym.scheduling.scheduler import RolloutScheduler, SchedulerClock, SchedulerConfig, SchedulerMode
from tests.termgym.scheduling.test_scheduler import fake_task

FAST = (Window(1000, 1.0),)


class WorkRunner:
    """Trials that take ``delays[task]`` seconds of loop time and report ``works[task]`` units of
    work; ``failing`` tasks fail (a sandbox error) their first time. Records each launch index."""

    backend, agent_name, run_id = "fake", "fake", "test"

    def __init__(self, pacer: Pacer, works: Mapping[str, float], delays: Mapping[str, float], failing=()) -> None:
        self.pacer, self.works, self.delays, self.failing = pacer, works, delays, set(failing)
        self.launches: list[tuple[str, int | None]] = []

    async def run_one(self, task, node, version, progress) -> TrialRecord:
        progress.created_at = await self.pacer.acquire()
        self.launches.append((task.name, progress.launch))
        await asyncio.sleep(self.delays[task.name])
        if task.name in self.failing:
            self.failing.discard(task.name)
            return TrialRecord(
                task=task.name,
                backend="fake",
                agent="fake",
                family=task.family,
                error={"kind": "sandbox_error", "message": "boom"},
            )
        turns = int(self.works[task.name])
        return TrialRecord(task=task.name, backend="fake", agent="fake", family=task.family, turns=turns, reward=1.0)

    def record_of(self, result: TrialRecord) -> TrialRecord:
        return result

    def work_of(self, result: TrialRecord) -> float:
        return self.works[result.task] + 0.5  # not the turns: the scheduler must ask


def run_steps(
    works,
    delays,
    *,
    batch,
    launch,
    mode: SchedulerMode = "cancel",
    clock: SchedulerClock = "work",
    caps=(64,),
    steps=1,
    **kw,
):
    tasks = [fake_task(name, name.rstrip("0123456789")) for name in works]

    async def main():
        pacer = Pacer(FAST)
        runner = WorkRunner(pacer, works, delays, **kw)
        config = SchedulerConfig(batch_size=batch, launch=launch, mode=mode, nodes=make_nodes(list(caps)), clock=clock)
        decided: list[tuple[str, str]] = []
        sched = RolloutScheduler(
            runner,
            TaskPool(tasks, shuffle=False),
            config,
            pacer=pacer,
            on_record=lambda f, r: decided.append((f, r.task)),
        )
        async with sched:
            results = [await sched.step() for _ in range(steps)]
        return results, runner, decided

    return simclock.run(main())


@pytest.mark.parametrize(
    ("works", "slots", "expected"),
    [
        ([3, 1, 2], 8, [3, 1, 2]),  # room for all: each finishes after its own work
        ([3, 1, 2], 1, [3, 4, 6]),  # one slot: one after the other, in launch order
        ([4, 1, 1, 1], 2, [4, 1, 2, 3]),  # the second slot serves the short ones while the first is busy
        ([2, 2, 1], 2, [2, 2, 3]),  # both slots free at 2: the lower slot takes the third
        ([], 3, []),
        ([-1.0, 1.0], 1, [0.0, 1.0]),  # no negative work
    ],
)
def test_simulated_finish(works, slots, expected):
    assert bias.simulated_finish(works, slots) == pytest.approx(expected)


def test_simulated_finish_needs_a_slot():
    with pytest.raises(ValueError, match="at least one slot"):
        bias.simulated_finish([1.0], 0)


@pytest.mark.parametrize(
    ("finish", "count", "expected"),
    [([5, 1, 3], 2, [1, 2]), ([2, 1, 2, 1], 3, [1, 3, 0]), ([1.0], 0, []), ([1.0, 2.0], 5, [0, 1])],
)
def test_first_to_finish_breaks_ties_by_launch(finish, count, expected):
    assert bias.first_to_finish(finish, count) == expected


def test_the_clock_is_validated():
    with pytest.raises(ValueError, match="unknown clock 'sundial'"):
        SchedulerConfig(batch_size=2, clock="sundial")  # type: ignore[arg-type]


WORKS = {"a0": 5, "a1": 1, "b0": 3, "b1": 2, "c0": 4, "c1": 6}
SLOW_SHORT = {"a0": 1.0, "a1": 60.0, "b0": 2.0, "b1": 50.0, "c0": 3.0, "c1": 4.0}  # the short ones end last
SLOW_LONG = {name: float(work) for name, work in WORKS.items()}  # ends in the order of their work


@pytest.mark.parametrize("mode", ["cancel", "reweight"])
def test_the_kept_set_follows_work_whatever_order_the_trials_end_in(mode):
    kept_sets = []
    for delays in (SLOW_SHORT, SLOW_LONG):
        (result,), _, decided = run_steps(WORKS, delays, batch=4, launch=6, mode=mode)
        kept_sets.append(sorted(k.record.task for k in result.kept))
        assert sorted(task for fate, task in decided if fate == "surplus") == ["a0", "c1"]  # finished, cut
        assert result.families.groups["a"].finished == 2 and result.families.groups["a"].kept == 1
    assert kept_sets == [["a1", "b0", "b1", "c0"]] * 2  # the four least work


def test_the_wall_clock_keeps_what_ended_first():
    # The contrast the work clock removes: on the wall clock the same trials give another batch.
    (result,), _, _ = run_steps(WORKS, SLOW_SHORT, batch=4, launch=6, clock="wall")
    assert sorted(k.record.task for k in result.kept) == ["a0", "b0", "c0", "c1"]


def test_slots_make_later_launches_finish_later():
    # Two slots: a0 (5) and a1 (1) start at once; b0 starts at 1 and ends at 4, b1 at 4 -> 6, c0 at 5 -> 9...
    # so c1, launched last, is cut although c0 has less work than a0.
    works = {"a0": 5, "a1": 1, "b0": 3, "b1": 2, "c0": 4, "c1": 1}
    (result,), _, _ = run_steps(works, SLOW_SHORT, batch=4, launch=6, caps=(2,))
    finish = dict(zip(works, bias.simulated_finish([w + 0.5 for w in works.values()], 2)))
    assert sorted(k.record.task for k in result.kept) == sorted(sorted(works, key=finish.__getitem__)[:4])
    assert "c1" not in {k.record.task for k in result.kept}


def test_failed_trials_are_replaced_and_never_kept_on_the_work_clock():
    (result,), runner, decided = run_steps(WORKS, SLOW_SHORT, batch=4, launch=6, failing=("a1",))
    assert ("failed", "a1") in decided and [name for name, _ in runner.launches].count("a1") == 2
    assert ("a1", 6) in runner.launches  # the replacement's launch index follows the first launches
    assert len(result.kept) == 4 and all(k.record.error is None for k in result.kept)


def test_launch_indices_are_the_launch_order():
    _, runner, _ = run_steps(WORKS, SLOW_SHORT, batch=4, launch=6)
    assert sorted(runner.launches, key=lambda x: x[1] or 0) == [(name, i) for i, name in enumerate(WORKS)]


def test_carry_over_on_the_work_clock_carries_the_cut_with_the_work_left():
    works = {"a0": 1, "a1": 3, "b0": 2, "b1": 3}
    delays = {n: 10.0 - w for n, w in works.items()}  # ends in the reverse order of work
    first, second = run_steps(works, delays, batch=2, launch=3, mode="carry-over", steps=2)[0]
    assert sorted(k.record.task for k in first.kept) == ["a0", "b0"]  # a1 (3.5) is cut at 2.5: carried
    assert first.families.groups["a"].carried == 1
    # step 2: a1 with 1.0 left, then the two new launches b1 (3.5) and a0 (1.5); in full a1 would tie b1
    assert sorted(k.record.task for k in second.kept) == ["a0", "a1"]
    assert {k.record.task: k.staleness for k in second.kept} == {"a1": 1, "a0": 0}


def test_without_work_of_the_turns_are_the_work():
    class TurnsOnly(WorkRunner):
        work_of = None  # type: ignore[assignment]

    tasks = [fake_task(name, name[0]) for name in WORKS]

    async def main():
        pacer = Pacer(FAST)
        runner = TurnsOnly(pacer, WORKS, SLOW_SHORT)
        config = SchedulerConfig(batch_size=2, launch=6, mode="cancel", clock="work")
        async with RolloutScheduler(runner, TaskPool(tasks, shuffle=False), config, pacer=pacer) as sched:
            return await sched.step()

    result = simclock.run(main())
    assert sorted(k.record.task for k in result.kept) == ["a1", "b1"]  # turns 1 and 2


def test_wait_mode_keeps_every_trial_on_either_clock():
    (result,), _, _ = run_steps(WORKS, SLOW_SHORT, batch=6, launch=None, mode="wait")
    assert sorted(k.record.task for k in result.kept) == sorted(WORKS)
