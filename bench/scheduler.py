"""Rollout scheduling modes side by side, at the published scale, on simulated sandboxes.

Batch 512, 560 launched per step, 6 rollout nodes capped at 70 to 94 trials, creation paced at 6/s
and 600/min, the 20 bundled tasks with the latency model of ``termgym.scheduling.latency.BUNDLED``. Each mode
runs the same number of steps with the same seed through the real scheduler, env and trial code
(``termgym.scheduling.simulated``) on a virtual clock. Per mode: the mean step wall time against
its lower bound (pacing alone, or the longest kept trial, whichever is larger), against
``cancel``'s wall time, the trials cancelled per step, the longest family's share among launched
trials against kept (and importance-weighted) trials over the run, and the total-variation
distances. Targets: ``cancel`` within 1.1 of its bound; a bias-correcting mode within 2 points of
the launched share at no more than 1.15 of ``cancel``'s wall time.

    .venv/bin/python bench/scheduler.py [--steps 8] [--seed 0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from termgym.sandboxes.pacing import Pacer
from termgym.scheduling import simclock
from termgym.scheduling.bias import PUBLISHED_BATCH, PUBLISHED_LAUNCHED
from termgym.scheduling.pool import TaskPool, make_nodes
from termgym.scheduling.runners import TrialRunner
from termgym.scheduling.scheduler import MODES, RolloutScheduler, SchedulerConfig, SchedulerMode
from termgym.scheduling.simulated import SimulatedAgent, SimulatedBackend
from termgym.tasks import discover_tasks
from termgym.tasks.bundled import bundled_root

CAPS = (70, 75, 80, 85, 90, 94)


async def run_mode(mode: SchedulerMode, tasks: list, steps: int, seed: int) -> dict:
    backend = SimulatedBackend(seed=seed)
    pacer = Pacer()
    runner = TrialRunner(SimulatedAgent(), backend.options(f"bench-{mode}"), pacer, sandbox_factory=backend)
    config = SchedulerConfig(batch_size=PUBLISHED_BATCH, launch=PUBLISHED_LAUNCHED, mode=mode, nodes=make_nodes(CAPS))
    results = []
    async with RolloutScheduler(runner, TaskPool(tasks, seed=seed), config, pacer=pacer) as scheduler:
        for _ in range(steps):
            results.append(await scheduler.step())
    run = scheduler.run_families  # after close(): a carried tail counts as launched and cancelled
    return {
        "wall": sum(r.wall_seconds for r in results) / steps,
        "bound": sum(r.lower_bound for r in results) / steps,
        "cancelled": sum(r.families.totals.cancelled for r in results) / steps,
        "launched": sum(r.families.totals.launched for r in results) / steps,
        "run": run,
        "ess": min(r.effective_sample_size for r in results),
        "staleness": max(k.staleness for r in results for k in r.kept),
        "leaked": len(backend.live),
    }


def main() -> None:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tasks = discover_tasks(bundled_root())
    rows = {}
    for mode in MODES:
        started = time.perf_counter()
        rows[mode] = simclock.run(run_mode(mode, tasks, args.steps, args.seed))
        rows[mode]["real"] = time.perf_counter() - started
    longest = rows["wait"]["run"].longest()
    cancel_wall = rows["cancel"]["wall"]
    print(
        f"B={PUBLISHED_BATCH}, {PUBLISHED_LAUNCHED} launched, nodes {'/'.join(map(str, CAPS))}, 6/s and 600/min, "
        f"{args.steps} steps per mode, seed {args.seed}; longest family: {longest}\n"
    )
    print(
        "| mode | wall s/step | bound s/step | wall/bound | wall/cancel | launched/step | cancelled/step "
        f"| {longest} launched % | kept % | weighted % | TV kept | TV weighted | min ESS "
        "| max staleness | real s |"
    )
    print("|" + "---|" * 15)
    for mode, row in rows.items():
        run = row["run"]
        print(
            f"| {mode} | {row['wall']:.0f} | {row['bound']:.0f} | {row['wall'] / row['bound']:.3f} "
            f"| {row['wall'] / cancel_wall:.3f} "
            f"| {row['launched']:.1f} | {row['cancelled']:.1f} | {100 * run.launched_share[longest]:.1f} "
            f"| {100 * run.kept_share[longest]:.1f} | {100 * run.weighted_share[longest]:.1f} | {run.tv_distance:.3f} "
            f"| {run.tv_distance_weighted:.3f} | {row['ess']:.0f} | {row['staleness']} | {row['real']:.1f} |"
        )
    print()
    cancel = rows["cancel"]
    print(
        f"cancel: wall/bound {cancel['wall'] / cancel['bound']:.3f} (target <= 1.1): "
        f"{'met' if cancel['wall'] <= 1.1 * cancel['bound'] else 'MISSED'}"
    )
    for mode, share_key in (("carry-over", "kept_share"), ("reweight", "weighted_share")):
        run, row = rows[mode]["run"], rows[mode]
        gap = 100 * abs(getattr(run, share_key)[longest] - run.launched_share[longest])
        ok = gap <= 2.0 and row["wall"] <= 1.15 * cancel_wall
        print(
            f"{mode}: {longest} {share_key.replace('_', ' ')} within {gap:.2f} points of launched, "
            f"wall {row['wall'] / cancel_wall:.3f} x cancel (targets <= 2 points, <= 1.15): "
            f"{'met' if ok else 'MISSED'}"
        )
    leaked = {mode: row["leaked"] for mode, row in rows.items() if row["leaked"]}
    print(f"sandboxes left alive after the run: {leaked or 'none'}")


if __name__ == "__main__":
    main()
