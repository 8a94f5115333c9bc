"""The scheduler on the embedded backend: real bubblewrap sandboxes, a small batch, real cancellation."""

from __future__ import annotations

from termgym.agents import OracleAgent
from termgym.episode.options import EnvOptions
from termgym.sandboxes.pacing import Pacer
from termgym.scheduling.pool import TaskPool, make_nodes
from termgym.scheduling.runners import TrialRunner
from termgym.scheduling.scheduler import RolloutScheduler, SchedulerConfig
from termgym.tasks import load_task
from tests.helpers import sandbox_processes, write_task

SLOW_SOLUTION = "#!/bin/bash\nsleep 300 &\nsleep 300\necho done > /app/result.txt\n"


async def test_cancelled_trials_release_their_sandboxes_before_the_step_returns(tmp_path, no_leaks):
    quick = [load_task(write_task(tmp_path, f"quick{i}")) for i in range(2)]
    slow = [load_task(write_task(tmp_path, f"slow{i}", solve_sh=SLOW_SOLUTION, agent_timeout=600)) for i in range(2)]
    pacer = Pacer()
    runner = TrialRunner(OracleAgent(), EnvOptions(run_id="sched-test"), pacer)
    config = SchedulerConfig(batch_size=2, launch=4, mode="cancel", nodes=make_nodes([2, 2]))
    decided = []
    scheduler = RolloutScheduler(
        runner,
        TaskPool(quick + slow, shuffle=False),
        config,
        pacer=pacer,
        on_record=lambda fate, record: decided.append((fate, record)),
    )
    result = await scheduler.step()

    # Checked at once, not at teardown: the sandboxes were gone when step() returned.
    assert list(no_leaks.iterdir()) == []
    assert not [p for p in sandbox_processes() if str(no_leaks) in p]
    assert sorted(k.record.task for k in result.kept) == ["quick0", "quick1"]
    assert all(k.record.resolved and k.record.backend == "local" for k in result.kept)
    cancelled = [r for fate, r in decided if fate == "cancelled"]
    assert sorted(r.task for r in cancelled) == ["slow0", "slow1"]
    assert all(r.error["kind"] == "cancelled" and r.backend == "local" and r.agent == "oracle" for r in cancelled)
    assert result.families.totals.launched == 4 and pacer.granted == 4
    assert result.wall_seconds < 60


async def test_wait_mode_runs_every_trial_on_real_sandboxes(tmp_path, no_leaks):
    tasks = [
        load_task(write_task(tmp_path, "good")),
        load_task(write_task(tmp_path, "wrong", solve_sh="#!/bin/bash\necho wrong > /app/result.txt\n")),
    ]
    pacer = Pacer()
    runner = TrialRunner(OracleAgent(), EnvOptions(run_id="sched-test"), pacer)
    config = SchedulerConfig(batch_size=4, mode="wait", nodes=make_nodes([2]))
    scheduler = RolloutScheduler(runner, TaskPool(tasks * 2, shuffle=False), config, pacer=pacer)
    result = await scheduler.step()
    assert len(result.kept) == 4 and result.families.totals.cancelled == 0
    assert (
        sorted((k.record.task, k.record.resolved) for k in result.kept) == [("good", True)] * 2 + [("wrong", False)] * 2
    )
    assert all(k.duration > 0 for k in result.kept) and result.node_peaks == {"node-0": 2}
