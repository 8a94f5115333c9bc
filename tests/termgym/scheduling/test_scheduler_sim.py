"""The scheduler on simulated sandboxes (the real env and trial code, a latency model, a virtual
clock): the published set-up at full scale, failures, and the latency model itself."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import replace

import pytest

from termgym.sandboxes.pacing import Pacer, max_in_any_window
from termgym.scheduling import simclock
from termgym.scheduling.bias import launch_count
from termgym.scheduling.latency import BUNDLED, FamilyLatency, LatencyModel, plan_trial
from termgym.scheduling.pool import TaskPool, make_nodes
from termgym.scheduling.runners import TrialRunner
from termgym.scheduling.scheduler import RolloutScheduler, SchedulerConfig, SchedulerMode
from termgym.scheduling.simulated import SimulatedAgent, SimulatedBackend
from termgym.tasks import discover_tasks
from termgym.tasks.bundled import bundled_root
from termgym.trial import run_trial

PUBLISHED_CAPS = (70, 75, 80, 85, 90, 94)


@pytest.fixture(scope="module")
def bundled_tasks():
    return discover_tasks(bundled_root())


def simulate(
    tasks,
    *,
    batch,
    mode: SchedulerMode = "cancel",
    launch=None,
    caps=PUBLISHED_CAPS,
    model=BUNDLED,
    steps=1,
    seed=0,
    retries=2,
):
    """Run ``steps`` steps on a virtual clock; returns (results, sandboxes alive after each step,
    backend, decided records, real seconds)."""

    async def main():
        backend = SimulatedBackend(model, seed=seed)
        pacer = Pacer()
        runner = TrialRunner(SimulatedAgent(), backend.options("sim"), pacer, sandbox_factory=backend)
        config = SchedulerConfig(
            batch_size=batch, launch=launch, mode=mode, nodes=make_nodes(list(caps)), retries=retries
        )
        decided = []
        record = lambda fate, rec: decided.append((fate, rec))  # noqa: E731
        sched = RolloutScheduler(runner, TaskPool(tasks, seed=seed), config, pacer=pacer, on_record=record)
        results, live = [], []
        for _ in range(steps):
            results.append(await sched.step())
            live.append(len(backend.live))
        return results, live, backend, decided

    started = time.monotonic()
    results, live, backend, decided = simclock.run(main())
    return results, live, backend, decided, time.monotonic() - started


def test_published_step_512_of_560_on_six_capped_nodes(bundled_tasks):
    (result,), (live_after,), backend, decided, real_seconds = simulate(bundled_tasks, batch=512)
    totals = result.families.totals
    assert len(result.kept) == 512 and result.short == 0
    assert totals.launched == 560 + totals.failed  # every failure replaced
    assert totals.finished + totals.cancelled + totals.failed == totals.launched and totals.cancelled >= 560 - 512 - 2
    # pacing: without the pacer, the 494 node slots would all request a sandbox at once
    assert len(backend.requests) > 494
    assert max_in_any_window(backend.requests, 1.0) <= 6 and max_in_any_window(backend.requests, 60.0) <= 600
    # caps: no node ran more than its cap
    assert all(result.node_peaks[f"node-{i}"] <= cap for i, cap in enumerate(PUBLISHED_CAPS))
    # every sandbox, cancelled ones included, was deleted before step() returned
    assert live_after == 0 and backend.created == backend.released
    assert [r.error["kind"] for f, r in decided if f == "cancelled"] == ["cancelled"] * totals.cancelled
    assert len(decided) == totals.launched  # every trial has a record
    # the straggler bias the model is built to show: the long family loses share
    assert result.families.longest() == "shell-scripting"
    assert result.families.kept_share["shell-scripting"] < result.families.launched_share["shell-scripting"] - 0.03
    assert result.lower_bound <= result.wall_seconds < 1.15 * result.lower_bound
    assert real_seconds < 30  # minutes of simulated trials in seconds (about 1 s on a laptop core)


def test_failed_sandboxes_are_recorded_and_replaced(bundled_tasks):
    flaky = replace(BUNDLED, failure_rate=0.2, loss_rate=0.1)
    (result,), (live_after,), backend, decided, _ = simulate(
        bundled_tasks, batch=60, caps=(16, 16), model=flaky, retries=10
    )
    totals = result.families.totals
    failed = [r for f, r in decided if f == "failed"]
    assert len(result.kept) == 60 and totals.failed == len(failed) > 10
    assert all(r.error["kind"] == "sandbox_error" for r in failed)
    assert any("lost" in r.error["message"] for r in failed) and any(
        "could not be created" in r.error["message"] for r in failed
    )
    assert (
        totals.launched == launch_count(60) + totals.failed
    )  # each failure replaced once (10 retries: never exhausted)
    assert all(k.record.error is None for k in result.kept)
    assert live_after == 0 and backend.created == backend.released


def test_carry_over_releases_everything_on_close_and_tags_versions(bundled_tasks):
    async def main():
        backend = SimulatedBackend(seed=2)
        pacer = Pacer()
        runner = TrialRunner(SimulatedAgent(), backend.options("sim"), pacer, sandbox_factory=backend)
        config = SchedulerConfig(batch_size=64, mode="carry-over", nodes=make_nodes([40, 40]))
        async with RolloutScheduler(runner, TaskPool(bundled_tasks), config, pacer=pacer) as sched:
            first = await sched.step()
            live_between = len(backend.live)
            second = await sched.step()
        return first, live_between, second, backend

    first, live_between, second, backend = simclock.run(main())
    carried = first.families.totals.carried
    assert carried > 0 and live_between >= carried - first.families.totals.failed
    assert {k.staleness for k in second.kept} == {0, 1} and len(second.kept) == 64
    assert all(k.policy_version == 0 for k in second.kept if k.staleness == 1)
    assert not backend.live and backend.created == backend.released


def test_a_lost_sandbox_is_a_sandbox_error_record(bundled_tasks):
    lossy = replace(BUNDLED, failure_rate=0.0, loss_rate=0.999)

    async def main():
        backend = SimulatedBackend(lossy, seed=1)
        return await run_trial(bundled_tasks[0], SimulatedAgent(), backend.options(), sandbox_factory=backend), backend

    record, backend = simclock.run(main())
    assert record.error is not None, record
    assert record.error["kind"] == "sandbox_error" and "lost" in record.error["message"]
    assert not backend.live and backend.released == 1


def test_a_simulated_trial_runs_its_plan_through_the_real_env(bundled_tasks):
    async def main():
        backend = SimulatedBackend(replace(BUNDLED, failure_rate=0.0, loss_rate=0.0), seed=5)
        loop = asyncio.get_running_loop()
        record = await run_trial(bundled_tasks[0], SimulatedAgent(), backend.options(), sandbox_factory=backend)
        return record, loop.time()

    record, elapsed = simclock.run(main())
    plan = plan_trial(replace(BUNDLED, failure_rate=0.0, loss_rate=0.0), bundled_tasks[0].family, random.Random(5))
    assert record.error is None and record.turns == plan.turns and record.resolved == plan.resolved
    assert record.report_format == ("ctrf" if bundled_tasks[0].report_format == "ctrf" else "exit-code")
    assert record.total == (bundled_tasks[0].expected_assertions or 1)
    expected = plan.create_seconds + plan.agent_seconds + plan.verify_seconds + plan.release_seconds
    assert elapsed == pytest.approx(expected, rel=1e-6, abs=1e-3)


# -- the latency model -------------------------------------------------------------------------------


def test_plans_are_deterministic_and_bounded():
    first = [plan_trial(BUNDLED, "shell-scripting", random.Random(11)) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    rng = random.Random(0)
    plans = [plan_trial(BUNDLED, family, rng) for family in BUNDLED.families for _ in range(500)]
    assert all(1 <= p.turns <= BUNDLED.max_turns and p.agent_seconds <= BUNDLED.max_agent_seconds + 1e-6 for p in plans)
    assert all(p.lost_at_turn is None or 0 <= p.lost_at_turn < p.turns for p in plans)


def test_shell_scripting_is_the_longest_family_with_the_heaviest_tail():
    families = BUNDLED.families
    longest = max(families, key=lambda f: families[f].median_seconds)
    assert longest == "shell-scripting"
    for name, family in families.items():
        if name != longest:
            assert families[longest].quantile(0.95) > 2 * family.quantile(0.95)
            assert families[longest].sigma > family.sigma


@pytest.mark.parametrize("rate", [0.0, 0.05, 0.3])
def test_failure_rate_is_respected(rate):
    model = LatencyModel(families={}, failure_rate=rate)
    rng = random.Random(3)
    failures = sum(plan_trial(model, "any", rng).create_fails for _ in range(4000))
    assert failures / 4000 == pytest.approx(rate, abs=0.02)


def test_unknown_families_use_the_default():
    rng = random.Random(1)
    assert plan_trial(BUNDLED, "never-heard-of-it", rng).family == "never-heard-of-it"
    assert BUNDLED.family("never-heard-of-it") == BUNDLED.default


@pytest.mark.parametrize(
    "bad",
    [
        dict(median_seconds=0, sigma=1, median_turns=3),
        dict(median_seconds=5, sigma=-1, median_turns=3),
        dict(median_seconds=5, sigma=1, median_turns=0),
        dict(median_seconds=5, sigma=1, median_turns=3, resolve_rate=2),
    ],
)
def test_family_latency_is_validated(bad):
    with pytest.raises(ValueError, match=r"^invalid family latency FamilyLatency\("):
        FamilyLatency(**bad)
