"""The embedded backend's warm pool (``TERMGYM_LOCAL_POOL``), measured side by side in one run.

Rounds interleave every kind (so a noisy neighbour slows all alike); medians:

- a fresh ``bwrap ... true`` spawn (``bench/step_latency.py``'s): the kernel's own cost of a sandbox;
- a trivial trial (``bench/embedded_trial.py``'s task: create, one step, verify, remove) without the
  pool, cache warm; and the same trial whose agent leaves a file outside its work directory, so
  that the verifier runs under the tamper check's tracer (an agent that changed nothing outside its
  work leaves nothing a trace could find: its verifier runs untraced);
- the same trial's critical path with the pool: a sandbox of its recipe made ready ahead (untimed:
  the scheduler's prewarm does it while the trainer updates), then the trial, timed; target at most
  6x the spawn; and so with a change outside the work, traced;
- the whole cost with the pool: the making of that sandbox and the trial, both timed.

Then a step of ``--step`` trivial trials, ``--concurrency`` at a time, without the pool and with
it: the pool holding ``--ready`` sandboxes at the step's start (default: one per trial), made
untimed as above (the scheduler's prewarm makes them while the trainer updates), either refilled
in the background after each take (``TERMGYM_LOCAL_POOL_REFILL=take``, the default) or only by the
prewarm (``=prewarm``); target at most 0.6x. The prewarm's own time is reported: it is what the
trainer's update must cover for the pool to pay. The pooled trials above run with ``=prewarm``, so
that no refill runs beside the trial timed.

    .venv/bin/python bench/warm_pool.py [--rounds 20] [--step 32] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.embedded_trial import OUTSIDE_WORK, one_trial, trivial_task
from bench.step_latency import measure_spawn
from termgym.episode.options import EnvOptions
from termgym.episode.spec import options_sandbox_spec
from termgym.sandboxes import close_backends, prewarm
from termgym.tasks import Task


def pool(size: int, refill: str = "prewarm") -> None:
    """Turn the pool on with ``size`` per recipe (0: off), refilled as ``refill`` says
    (``TERMGYM_LOCAL_POOL_REFILL``); the next use makes a fresh one."""
    if size:
        os.environ["TERMGYM_LOCAL_POOL"] = str(size)
        os.environ["TERMGYM_LOCAL_POOL_TOTAL"] = str(max(size, 32))
        os.environ["TERMGYM_LOCAL_POOL_REFILL"] = refill
    else:
        os.environ.pop("TERMGYM_LOCAL_POOL", None)


async def ready(task: Task, count: int) -> float:
    """Make ``count`` sandboxes of the task's recipe ready; seconds it took."""
    started = time.perf_counter()
    made = await prewarm("local", [options_sandbox_spec(task, EnvOptions())], count)
    assert made >= count, f"the pool made {made} of {count}"
    return time.perf_counter() - started


async def step(task: Task, trials: int, concurrency: int) -> float:
    limit = asyncio.Semaphore(concurrency)

    async def one() -> None:
        async with limit:
            await one_trial(task)

    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(trials)))
    return time.perf_counter() - started


async def measure(args: argparse.Namespace) -> dict[str, float]:
    task = trivial_task(Path(tempfile.mkdtemp(prefix="termgym-bench-")))
    await one_trial(task)  # the prepared-environment cache warm, this process too
    spawns, cold, cold_traced, critical, critical_traced, whole = [], [], [], [], [], []
    for _ in range(args.rounds):
        spawns.append(await asyncio.to_thread(measure_spawn, 3))
        pool(0)
        await close_backends()
        cold.append(await one_trial(task))
        cold_traced.append(await one_trial(task, OUTSIDE_WORK))
        pool(1)
        made = await ready(task, 1)
        trial = await one_trial(task)  # adopts the ready sandbox; nothing refills meanwhile
        critical.append(trial)
        whole.append(made + trial)
        await ready(task, 1)
        critical_traced.append(await one_trial(task, OUTSIDE_WORK))
        await close_backends()
    pool(0)
    await close_backends()
    without = await step(task, args.step, args.concurrency)
    steps = {}
    for refill in ("take", "prewarm"):
        pool(args.ready or args.step, refill)
        prewarmed = await ready(task, args.ready or args.step)
        steps[refill] = await step(task, args.step, args.concurrency)
        await close_backends()
    pool(0)
    return {
        "spawn": statistics.median(spawns),
        "cold": statistics.median(cold),
        "cold_traced": statistics.median(cold_traced),
        "critical": statistics.median(critical),
        "critical_traced": statistics.median(critical_traced),
        "whole": statistics.median(whole),
        "step_without": without,
        "step_take": steps["take"],
        "step_prewarm": steps["prewarm"],
        "prewarm": prewarmed,
    }


def main() -> None:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--step", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--ready", type=int, default=0, help="sandboxes ready at the step's start (default: --step)")
    args = parser.parse_args()
    m = asyncio.run(measure(args))
    spawn = m["spawn"]
    print("| what | median ms | x spawn |")
    print("|---|---|---|")
    for label, key in (
        ("bwrap true spawn", "spawn"),
        ("trivial trial, no pool", "cold"),
        ("the same, a change outside the work (verifier traced)", "cold_traced"),
        ("trivial trial's critical path, sandbox from the pool (target <= 6x spawn)", "critical"),
        ("the same, a change outside the work (verifier traced)", "critical_traced"),
        ("trivial trial's whole cost with the pool (making the sandbox + the trial)", "whole"),
    ):
        print(f"| {label} | {m[key] * 1000:.1f} | {m[key] / spawn:.1f} |")
    print()
    print(
        f"| step of {args.step} trials, {args.concurrency} at a time, {args.ready or args.step} ready | seconds | x without |"
    )
    print("|---|---|---|")
    print(f"| without the pool | {m['step_without']:.2f} | 1.00 |")
    for label, key in (
        ("with the pool, refilled after each take (`REFILL=take`, the default)", "step_take"),
        ("with the pool, filled by the prewarm only (`REFILL=prewarm`; target <= 0.6x)", "step_prewarm"),
    ):
        print(f"| {label} | {m[key]:.2f} | {m[key] / m['step_without']:.2f} |")
    print(f"| the pool's prewarm before the step (overlaps the trainer's update) | {m['prewarm']:.2f} | |")


if __name__ == "__main__":
    main()
