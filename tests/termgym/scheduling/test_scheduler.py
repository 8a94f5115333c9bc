"""The scheduler's logic, on a virtual clock, with a runner whose trials just sleep a set time."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import cast

import pytest

from termgym.episode.options import EnvOptions
from termgym.errors import SandboxError
from termgym.records import TrialRecord
from termgym.sandboxes.base import Sandbox, SandboxSpec
from termgym.sandboxes.pacing import Pacer, Window, max_in_any_window
from termgym.scheduling import simclock
from termgym.scheduling.pool import Node, NodePool, TaskPool, make_nodes, pick_node
from termgym.scheduling.runners import TrialProgress, TrialRunner, paced_factory
from termgym.scheduling.scheduler import KeptTrial, RolloutScheduler, SchedulerConfig, SchedulerMode, step_metrics
from termgym.tasks import Task

FAST = (Window(1000, 1.0),)  # pacing that never binds


def fake_task(name: str, family: str | None = None) -> Task:
    # A stand-in for a Task with only the name and family the scheduler reads (the runners here never load one).
    return cast(Task, SimpleNamespace(name=name, family=family or name.rstrip("0123456789")))


class SleepRunner:
    """Trials that sleep ``durations[task]`` seconds after a paced "creation"; tasks in ``failing``
    fail with a sandbox error their first ``failing[task]`` times. Counts what runs on each node."""

    backend, agent_name, run_id = "fake", "fake", "test"

    def __init__(self, pacer: Pacer, durations: dict[str, float], failing: dict[str, int] | None = None) -> None:
        self.pacer, self.durations, self.failing = pacer, durations, dict(failing or {})
        self.active: Counter[str] = Counter()
        self.peak: Counter[str] = Counter()
        self.grants: list[float] = []
        self.running = 0
        self.versions: list[int] = []

    async def run_one(self, task, node, version, progress) -> TrialRecord:
        self.active[node.name] += 1
        self.peak[node.name] = max(self.peak[node.name], self.active[node.name])
        self.running += 1
        self.versions.append(version)
        try:
            progress.created_at = await self.pacer.acquire()
            self.grants.append(progress.created_at)
            if self.failing.get(task.name, 0) > 0:
                self.failing[task.name] -= 1
                await asyncio.sleep(1.0)
                return TrialRecord(
                    task=task.name,
                    backend="fake",
                    agent="fake",
                    family=task.family,
                    error={"kind": "sandbox_error", "message": "boom"},
                )
            await asyncio.sleep(self.durations[task.name])
            return TrialRecord(task=task.name, backend="fake", agent="fake", family=task.family, turns=3, reward=1.0)
        finally:
            self.active[node.name] -= 1
            self.running -= 1

    def record_of(self, result: TrialRecord) -> TrialRecord:
        return result


def scheduler(
    tasks,
    durations,
    *,
    batch,
    launch=None,
    mode: SchedulerMode = "cancel",
    caps=(64,),
    failing=None,
    windows=FAST,
    retries=2,
):
    pacer = Pacer(windows)
    runner = SleepRunner(pacer, durations, failing)
    config = SchedulerConfig(batch_size=batch, launch=launch, mode=mode, nodes=make_nodes(list(caps)), retries=retries)
    decided: list[tuple[str, TrialRecord]] = []
    record = lambda fate, rec: decided.append((fate, rec))  # noqa: E731
    sched = RolloutScheduler(runner, TaskPool(tasks, shuffle=False), config, pacer=pacer, on_record=record)
    return sched, runner, decided


# -- pure pieces -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("busy", "caps", "expected"),
    [
        ([0, 0], [70, 94], 0),  # ties go to the first
        ([35, 46], [70, 94], 1),  # 0.500 against 0.489
        ([70, 93], [70, 94], 1),
        ([70, 94], [70, 94], None),  # all full
        ([1, 1, 0], [2, 2, 2], 2),
        ([0], [1], 0),
    ],
)
def test_pick_node(busy, caps, expected):
    assert pick_node(busy, caps) == expected


def test_task_pool_draws_each_task_once_per_epoch():
    tasks = [fake_task(f"t{i}") for i in range(7)]
    pool = TaskPool(tasks, seed=3)
    drawn = pool.draw(7 * 4 + 2)
    for epoch in range(4):
        assert sorted(t.name for t in drawn[epoch * 7 : epoch * 7 + 7]) == sorted(t.name for t in tasks)
    assert [t.name for t in drawn[:7]] != [t.name for t in drawn[7:14]]  # reshuffled
    assert [t.name for t in TaskPool(tasks, seed=3).draw(30)] == [t.name for t in drawn]  # deterministic
    assert [t.name for t in TaskPool(tasks, shuffle=False).draw(9)] == [f"t{i}" for i in range(7)] + ["t0", "t1"]


def test_task_pool_must_not_be_empty():
    with pytest.raises(ValueError, match="the task pool is empty"):
        TaskPool([])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"batch_size": 0}, "batch size"),
        ({"batch_size": 4, "launch": 3}, "cannot fill"),
        ({"batch_size": 4, "mode": "drop"}, "unknown mode"),
        ({"batch_size": 4, "retries": -1}, "retries"),
        ({"batch_size": 4, "nodes": ()}, "node"),
    ],
)
def test_config_is_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**kwargs)


@pytest.mark.parametrize(
    ("mode", "launch", "expected"),
    [("cancel", None, 560), ("reweight", None, 560), ("carry-over", 600, 600), ("wait", 600, 512)],
)
def test_launched_per_step(mode, launch, expected):
    assert SchedulerConfig(batch_size=512, launch=launch, mode=mode).launched_per_step == expected


def test_node_caps_must_be_positive():
    with pytest.raises(ValueError, match="node n: the cap must be at least 1, got 0"):
        Node("n", 0)


def test_node_pool_hands_freed_slots_to_waiters_in_order():
    async def main():
        pool = NodePool([Node("a", 1), Node("b", 1)])
        first, second = await pool.acquire(), await pool.acquire()
        waiters = [asyncio.ensure_future(pool.acquire()) for _ in range(3)]
        await asyncio.sleep(0)
        waiters[1].cancel()  # a cancelled waiter never gets (or keeps) a slot
        await asyncio.sleep(0)
        pool.release(second)
        pool.release(first)
        got = [await waiters[0], await waiters[2]]
        return [n.name for n in (first, second)], [n.name for n in got], pool.busy, pool.peak

    assert simclock.run(main()) == (["a", "b"], ["b", "a"], [1, 1], [1, 1])


# -- steps ---------------------------------------------------------------------------------------------


def test_cancel_keeps_the_first_b_and_records_the_rest_as_cancelled():
    tasks = [fake_task(f"t{i}", "short" if i < 6 else "long") for i in range(8)]
    durations = {f"t{i}": 10.0 * (i + 1) for i in range(8)}

    async def main():
        sched, runner, decided = scheduler(tasks, durations, batch=5, launch=8)
        result = await sched.step()
        return result, runner, decided

    result, runner, decided = simclock.run(main())
    assert sorted(k.record.task for k in result.kept) == ["t0", "t1", "t2", "t3", "t4"]
    assert [k.duration for k in result.kept] == pytest.approx([10, 20, 30, 40, 50])
    assert all(k.weight == 1.0 and k.staleness == 0 and k.policy_version == 0 for k in result.kept)
    cancelled = [r for f, r in decided if f == "cancelled"]
    assert sorted(r.task for r in cancelled) == ["t5", "t6", "t7"]
    assert all(
        r.error is not None and r.error["kind"] == "cancelled" and r.timings["total"] == pytest.approx(50)
        for r in cancelled
    )
    assert runner.running == 0  # every cancelled trial has finished unwinding
    assert result.wall_seconds == pytest.approx(50) and result.lower_bound == pytest.approx(50)
    assert result.families.groups["long"].cancelled == 2 and result.families.kept_share["long"] == 0.0
    assert result.families.tv_distance == pytest.approx(2 / 8)


def test_wait_runs_exactly_b_and_cancels_nothing():
    tasks = [fake_task(f"t{i}") for i in range(4)]

    async def main():
        sched, _runner, decided = scheduler(
            tasks, {f"t{i}": 5.0 * (i + 1) for i in range(4)}, batch=4, launch=8, mode="wait"
        )
        return await sched.step(), decided

    result, decided = simclock.run(main())
    assert len(result.kept) == 4 and [f for f, _ in decided] == ["kept"] * 4
    assert result.wall_seconds == pytest.approx(20) and result.families.tv_distance == 0.0


def test_simultaneous_finishes_beyond_the_batch_are_surplus():
    tasks = [fake_task("a0"), fake_task("a1"), fake_task("a2")]

    async def main():
        sched, _, decided = scheduler(tasks, {"a0": 5.0, "a1": 5.0, "a2": 9.0}, batch=1, launch=3)
        return await sched.step(), decided

    result, decided = simclock.run(main())
    assert len(result.kept) == 1
    assert sorted(f for f, _ in decided) == ["cancelled", "kept", "surplus"]
    assert result.families.totals.finished == 2 and result.families.totals.kept == 1


def test_failed_trials_are_replaced_by_the_same_task_and_never_kept():
    tasks = [fake_task(f"t{i}") for i in range(6)]
    durations = {f"t{i}": 10.0 for i in range(6)}

    async def main():
        sched, _runner, decided = scheduler(tasks, durations, batch=6, mode="wait", failing={"t2": 2, "t4": 1})
        return await sched.step(), decided

    result, decided = simclock.run(main())
    assert len(result.kept) == 6 and result.short == 0
    failed = [r.task for f, r in decided if f == "failed"]
    assert sorted(failed) == ["t2", "t2", "t4"]
    assert result.families.totals.launched == 9 and result.families.totals.failed == 3
    assert all(k.record.error is None for k in result.kept)


def test_retries_run_out_and_the_batch_comes_back_short():
    tasks = [fake_task("ok"), fake_task("bad")]

    async def main():
        sched, _, decided = scheduler(
            tasks, {"ok": 1.0, "bad": 1.0}, batch=2, mode="wait", failing={"bad": 99}, retries=1
        )
        return await sched.step(), decided

    result, decided = simclock.run(main())
    assert len(result.kept) == 1 and result.short == 1
    assert [f for f, r in decided if r.task == "bad"] == ["failed", "failed"]


def test_a_sandbox_error_raised_by_the_runner_is_a_failed_trial():
    tasks = [fake_task("t0")]

    async def main():
        sched, runner, decided = scheduler(tasks, {"t0": 1.0}, batch=1, mode="wait", retries=0)

        async def explode(task, node, version, progress):
            raise SandboxError("provider down")

        runner.run_one = explode
        return await sched.step(), decided

    result, decided = simclock.run(main())
    assert result.short == 1 and decided[0][0] == "failed"
    assert decided[0][1].error == {"kind": "sandbox_error", "message": "provider down"}


def test_node_caps_and_pacing_are_never_exceeded():
    tasks = [fake_task(f"t{i}") for i in range(40)]
    durations = {f"t{i}": 3.0 + (i * 7) % 11 for i in range(40)}

    async def main():
        sched, runner, _ = scheduler(
            tasks, durations, batch=30, launch=40, caps=(3, 5, 4), windows=(Window(6, 1.0), Window(20, 60.0))
        )
        result = await sched.step()
        return result, runner

    result, runner = simclock.run(main())
    assert dict(runner.peak) == {"node-0": 3, "node-1": 5, "node-2": 4}  # counted by the runner itself
    assert result.node_peaks == {"node-0": 3, "node-1": 5, "node-2": 4}
    assert max_in_any_window(runner.grants, 1.0) <= 6 and max_in_any_window(runner.grants, 60.0) <= 20
    assert len(result.kept) == 30
    assert result.pacing_seconds == pytest.approx(63.0)  # the 21st grant waits for the minute; the 40th: 60 + 3


def test_carry_over_keeps_the_tail_for_the_next_step_with_its_version():
    tasks = [fake_task(f"t{i}") for i in range(5)]  # step 1 launches t0-t3, step 2 t4, t0, t1
    durations = {"t0": 10.0, "t1": 10.0, "t2": 10.0, "t3": 15.0, "t4": 30.0}  # t3 ends 5 s into step 2

    async def main():
        sched, runner, _decided = scheduler(tasks, durations, batch=3, launch=4, mode="carry-over")
        first = await sched.step(policy_version=7)
        carried_running = runner.running
        second = await sched.step(policy_version=8)
        closing = await sched.close()
        return first, carried_running, second, closing, runner, sched

    first, carried_running, second, closing, runner, sched = simclock.run(main())
    assert first.families.totals.carried == 1 and carried_running == 1
    assert second.families.totals.launched == 3  # 4 in flight: 1 carried + 3 new
    carried = [k for k in second.kept if k.policy_version == 7]
    assert [k.record.task for k in carried] == ["t3"] and carried[0].staleness == 1
    assert carried[0].duration == pytest.approx(15)
    assert (
        [r.task for r in closing] == ["t4"]
        and closing[0].error is not None
        and closing[0].error["kind"] == "cancelled"
        and runner.running == 0
    )
    run = sched.run_families
    assert run.totals.launched == 7 and run.totals.kept == 6 and run.totals.cancelled == 1 and run.totals.carried == 0


def test_reweight_gives_family_weights_with_mean_one():
    tasks = [fake_task(f"short{i}", "short") for i in range(6)] + [fake_task(f"long{i}", "long") for i in range(2)]
    durations = {**{f"short{i}": 5.0 for i in range(6)}, "long0": 6.0, "long1": 60.0}

    async def main():
        sched, _, _ = scheduler(tasks, durations, batch=7, launch=8, mode="reweight")
        return await sched.step()

    result = simclock.run(main())
    weights = {k.record.family: k.weight for k in result.kept}
    assert weights == pytest.approx({"short": (6 / 8) / (6 / 7), "long": (2 / 8) / (1 / 7)})
    assert sum(k.weight for k in result.kept) / len(result.kept) == pytest.approx(1.0)
    assert result.families.tv_distance_weighted == pytest.approx(0.0)
    assert result.effective_sample_size < 7


def test_a_cancelled_step_cancels_every_trial():
    tasks = [fake_task(f"t{i}") for i in range(5)]

    async def main():
        sched, runner, _ = scheduler(tasks, {f"t{i}": 100.0 for i in range(5)}, batch=5, mode="wait")
        step = asyncio.ensure_future(sched.step())
        await asyncio.sleep(10)
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step
        return runner.running

    assert simclock.run(main()) == 0


def test_step_metrics_is_json_ready():
    import json

    tasks = [fake_task(f"t{i}") for i in range(3)]

    async def main():
        sched, _, _ = scheduler(tasks, {"t0": 1.0, "t1": 2.0, "t2": 3.0}, batch=2, launch=3)
        return await sched.step()

    metrics = json.loads(json.dumps(step_metrics(simclock.run(main()))))
    assert metrics["kept"] == 2 and metrics["families"]["groups"]["t"]["cancelled"] == 1
    assert set(metrics["tasks"]["groups"]) == {"t0", "t1", "t2"} and metrics["run"]["families"]["totals"]["kept"] == 2


def test_kept_trial_is_what_the_trainer_reads():
    fields = set(KeptTrial.__dataclass_fields__)
    assert {"result", "record", "weight", "policy_version", "staleness"} <= fields


class _SelfPacingSandbox(Sandbox):
    """A backend that paces its own creates (as Daytona does); everything else is unused here."""

    backend = "self-paced"
    paces_own_creation = True

    async def start(self) -> None:
        self.started = True

    async def stop(self) -> None: ...

    async def run(self, command):
        raise NotImplementedError

    async def open_process(self, argv, *, env, cwd, user=None):
        raise NotImplementedError

    async def kill_agent_processes(self) -> None: ...


@pytest.mark.parametrize(("self_paced", "granted"), [(True, 0), (False, 2)])
async def test_a_create_is_never_paced_twice(self_paced, granted):
    pacer = Pacer((Window(5, 60.0),))
    progress = TrialProgress()

    def make(task, options):
        sandbox = _SelfPacingSandbox(SandboxSpec(name="t", context_dir=None, dockerfile=None))
        sandbox.paces_own_creation = self_paced
        return sandbox

    factory = paced_factory(make, pacer, progress)
    for _ in range(2):
        sandbox = await factory(fake_task("t"), EnvOptions())
        assert isinstance(sandbox, _SelfPacingSandbox)  # the backend's own sandbox, never a wrapper
    assert pacer.granted == granted and progress.created_at is not None


async def test_a_scheduled_trial_verifies_by_the_same_path_as_a_plain_one(tmp_path, no_leaks, monkeypatch):
    """On the embedded backend verification reaches the sandbox's files from the host
    (``Sandbox.host_files``). A scheduled trial's sandbox must be the backend's own, with every
    method it has: a forwarding wrapper that lacks one falls back to the base default, and every
    training rollout then verifies by another path than evaluation does."""
    from termgym.agents import OracleAgent
    from termgym.episode import verification
    from termgym.tasks import load_task
    from termgym.trial import run_trial
    from tests.helpers import write_task

    by_command: list[str] = []
    harness_step = verification._harness_step

    async def recorded(guard, step, argv, what):
        by_command.append(what)
        await harness_step(guard, step, argv, what)

    monkeypatch.setattr(verification, "_harness_step", recorded)
    task = load_task(write_task(tmp_path))
    plain = await run_trial(task, OracleAgent(), EnvOptions())
    pacer = Pacer()
    runner = TrialRunner(OracleAgent(), EnvOptions(run_id="sched-test"), pacer)
    scheduler = RolloutScheduler(
        runner, TaskPool([task], shuffle=False), SchedulerConfig(batch_size=1, mode="wait"), pacer=pacer
    )
    scheduled = (await scheduler.step()).kept[0].record
    assert plain.resolved and scheduled.resolved and pacer.granted == 1
    assert by_command == []  # neither reset /tests by a command in the sandbox


# -- prewarming the next step's sandboxes ---------------------------------------------------------------


def test_task_pool_peek_is_the_next_draw_and_draws_nothing():
    tasks = [fake_task(f"t{i}") for i in range(5)]
    pool, twin = TaskPool(tasks, seed=1), TaskPool(tasks, seed=1)
    for n in (3, 4, 0, 6, 5):  # across epoch boundaries, where the order is reshuffled
        peeked = [t.name for t in pool.peek(n)]
        assert [t.name for t in pool.peek(n)] == peeked
        assert [t.name for t in pool.draw(n)] == peeked == [t.name for t in twin.draw(n)]
    assert pool.epochs == twin.epochs


class PrewarmingRunner(SleepRunner):
    """A SleepRunner with the optional ``prewarm``: records what it was asked for; ``fail`` raises."""

    def __init__(self, pacer: Pacer, durations: dict[str, float], *, fail: bool = False, hold: float = 0.0) -> None:
        super().__init__(pacer, durations)
        self.asked: list[list[str]] = []
        self.fail, self.hold, self.cancelled = fail, hold, 0
        self.launched: list[str] = []

    async def run_one(self, task, node, version, progress) -> TrialRecord:
        self.launched.append(task.name)
        return await super().run_one(task, node, version, progress)

    async def prewarm(self, tasks) -> int:
        self.asked.append([t.name for t in tasks])
        try:
            await asyncio.sleep(self.hold)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail:
            raise SandboxError("the engine is gone")
        return len(tasks)


@pytest.mark.parametrize("mode", ["cancel", "carry-over"])
def test_each_step_prewarms_exactly_what_the_next_step_launches(mode):
    tasks = [fake_task(f"t{i}") for i in range(5)]
    durations = {"t0": 10.0, "t1": 10.0, "t2": 10.0, "t3": 15.0, "t4": 30.0}

    async def main():
        pacer = Pacer(FAST)
        runner = PrewarmingRunner(pacer, durations)
        config = SchedulerConfig(batch_size=3, launch=4, mode=mode, nodes=make_nodes([64]))
        sched = RolloutScheduler(runner, TaskPool(tasks, seed=2), config, pacer=pacer)
        launched_before = []
        for _ in range(3):
            launched_before.append(len(runner.launched))
            await sched.step()
        await asyncio.sleep(1)  # the last prewarm starts before close (which would cancel it unstarted)
        await sched.close()
        return runner, launched_before

    runner, launched_before = simclock.run(main())
    assert len(runner.asked) == 3  # after every step, for the step after it
    for step in (1, 2):  # what the prewarm after step N-1 named is what step N launched, in order
        start, end = launched_before[step], launched_before[step + 1] if step + 1 < 3 else len(runner.launched)
        assert runner.asked[step - 1] == runner.launched[start:end]
    if mode == "carry-over":  # a carried trial takes a slot: the next step launches fewer
        assert any(len(asked) < 4 for asked in runner.asked)


def test_a_failing_prewarm_fails_no_step_and_close_cancels_one_under_way():
    tasks = [fake_task(f"t{i}") for i in range(4)]
    durations: dict[str, float] = dict.fromkeys(("t0", "t1", "t2", "t3"), 1.0)

    async def run(fail: bool, hold: float):
        pacer = Pacer(FAST)
        runner = PrewarmingRunner(pacer, durations, fail=fail, hold=hold)
        config = SchedulerConfig(batch_size=2, mode="wait", nodes=make_nodes([64]))
        sched = RolloutScheduler(runner, TaskPool(tasks, shuffle=False), config, pacer=pacer)
        results = [await sched.step(), await sched.step()]
        await asyncio.sleep(1)
        await sched.close()
        return runner, results

    runner, results = simclock.run(run(fail=True, hold=0.0))
    assert [len(r.kept) for r in results] == [2, 2] and len(runner.asked) == 2
    runner, results = simclock.run(run(fail=False, hold=1000.0))  # never done before close
    assert len(runner.asked) == 1  # one under way at a time: the second step did not start another
    assert runner.cancelled == 1


def test_peek_leaves_a_subclass_counting_its_draws_as_it_was():
    class Counting(TaskPool):
        drawn = 0

        def draw(self, n):
            self.drawn += n
            return super().draw(n)

    pool = Counting([fake_task(f"t{i}") for i in range(3)], seed=0)
    pool.draw(2)
    pool.peek(5)
    assert pool.drawn == 2
