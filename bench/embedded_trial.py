"""What a whole trial costs on the embedded backend, side by side in one run.

Measured in rounds that interleave every kind (so a noisy neighbour slows all alike), medians:

- a fresh ``bwrap ... true`` spawn (``bench/step_latency.py``'s): the kernel's own cost of a sandbox;
- a trial of a trivial task (two COPY lines and one RUN, a 5-assertion verifier: create, one
  step, verify, remove), with the prepared-environment cache warm; target at most 6x the spawn;
- a trial of a RUN-heavy bundled task, cache warm, against the trivial task's; target at most 1.5x;
- verification overhead: ``verify()`` after one step and 0.1 s of the agent's time, against the
  verifier script's own run in the same sandbox (``exec`` of ``/tests/test.sh`` with the
  verifier's environment); target at most 15 ms;
- bundled-task throughput: every bundled task once at a time, ``--concurrency`` trials at once,
  cached against uncached (``TERMGYM_ENV_CACHE=0``); target at least 3x.

    .venv/bin/python bench/embedded_trial.py [--rounds 30] [--concurrency 2]
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

from bench.step_latency import measure_spawn
from termgym.agents.basic import OracleAgent, ScriptedAgent
from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.episode.verification import verifier_env, verify
from termgym.sandboxes.local.env_cache import EnvCache
from termgym.tasks import Task, load_task
from termgym.tasks.bundled import bundled_task_path, bundled_task_paths
from termgym.trial import run_trial
from tests.helpers import KIT_SOURCE, write_task

HEAVY = "archives/verify-backup"  # its RUN builds, checksums and tars a tree in loops


def trivial_task(root: Path) -> Task:
    checks = "".join(f'tg_check "input {i}" test -s /app/in{i % 2}.txt\n' for i in range(5))
    return load_task(
        write_task(
            root,
            "trivial",
            dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nCOPY in0.txt /app/\nCOPY in1.txt /app/\nRUN echo ready > /app/ready.txt\n",
            test_sh=f"#!/bin/sh\n{KIT_SOURCE}\n{checks}tg_finish\n",
            extra_files={"environment/in0.txt": "a\n", "environment/in1.txt": "b\n"},
        )
    )


OUTSIDE_WORK = "echo x > /tmp/note.txt"  # a change outside the work directory: the verifier runs traced


async def one_trial(task: Task, command: str = "true") -> float:
    """Seconds one trial of ``task`` takes whose agent runs ``command`` (by default nothing the
    tamper check could find loaded, so its verifier runs untraced; ``OUTSIDE_WORK``: traced)."""
    started = time.perf_counter()
    record = await run_trial(task, ScriptedAgent((command,)), EnvOptions())
    elapsed = time.perf_counter() - started
    if record.error is not None:
        raise SystemExit(f"{task.name}: {record.error}")
    return elapsed


async def verification_overhead(task: Task) -> tuple[float, float]:
    """(verify(), the verifier script alone) in one sandbox, seconds."""
    env = AsyncTerminalEnv(task, EnvOptions())
    async with env:
        await env.reset()
        await env.step("true")
        await asyncio.sleep(0.1)  # the agent's turns: the spare keeper is up by then, as in a real episode
        sandbox = env.sandbox
        assert sandbox is not None  # started by reset
        started = time.perf_counter()
        await verify(task, sandbox, reward_scale=1)
        whole = time.perf_counter() - started
        await sandbox.exec(["true"], timeout=60)  # a sandbox ready for commands, as verify() found it
        started = time.perf_counter()
        await sandbox.exec(
            [f"/tests/{task.test_script}"], env=verifier_env(task, sandbox)[0], cwd=sandbox.workdir, timeout=60
        )
        alone = time.perf_counter() - started
    return whole, alone


async def throughput(paths: list[Path], concurrency: int, cached: bool) -> float:
    """Trials per minute of every bundled task (its reference solution), ``concurrency`` at once."""
    os.environ["TERMGYM_ENV_CACHE"] = "1" if cached else "0"
    tasks = [load_task(path) for path in paths]
    limit = asyncio.Semaphore(concurrency)

    async def run(task: Task) -> None:
        async with limit:
            record = await run_trial(task, OracleAgent(), EnvOptions())
            if record.error is not None:
                raise SystemExit(f"{task.name}: {record.error}")

    started = time.perf_counter()
    await asyncio.gather(*(run(task) for task in tasks))
    return len(tasks) / (time.perf_counter() - started) * 60


async def measure(args: argparse.Namespace, root: Path) -> dict[str, float]:
    trivial = trivial_task(root)
    heavy_path = bundled_task_path(HEAVY)
    assert heavy_path is not None  # bundled with termgym
    heavy = load_task(heavy_path)
    for task in (trivial, heavy):  # warm the cache and this process
        await one_trial(task)
    spawns, trivials, heavies, wholes, alones = [], [], [], [], []
    for _ in range(args.rounds):
        spawns.append(await asyncio.to_thread(measure_spawn, 3))
        trivials.append(await one_trial(trivial))
        heavies.append(await one_trial(heavy))
        whole, alone = await verification_overhead(trivial)
        wholes.append(whole)
        alones.append(alone)
    paths = bundled_task_paths()
    await throughput(paths, args.concurrency, cached=True)  # every entry made
    uncached = await throughput(paths, args.concurrency, cached=False)
    cached = await throughput(paths, args.concurrency, cached=True)
    return {
        "spawn": statistics.median(spawns),
        "trivial": statistics.median(trivials),
        "heavy": statistics.median(heavies),
        "verify": statistics.median(wholes),
        "verifier": statistics.median(alones),
        "overhead": statistics.median(w - a for w, a in zip(wholes, alones, strict=True)),
        "uncached": uncached,
        "cached": cached,
        "tasks": len(paths),
    }


def main() -> None:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryDirectory() as cache:
        os.environ["TERMGYM_ENV_CACHE_DIR"] = cache  # a cache of its own, removed at the end
        try:
            m = asyncio.run(measure(args, Path(scratch)))
        finally:
            EnvCache.from_environment().clear()
    ms = {
        key: value * 1e3
        for key, value in m.items()
        if key in ("spawn", "trivial", "heavy", "verify", "verifier", "overhead")
    }
    print("| measure (median) | ms | ratio | target |")
    print("|---|---|---|---|")
    print(f"| fresh `bwrap ... true` spawn | {ms['spawn']:.1f} | 1 | |")
    print(
        f"| trial, trivial task (cache warm) | {ms['trivial']:.1f} | {m['trivial'] / m['spawn']:.1f}x the spawn | at most 6x |"
    )
    print(
        f"| trial, `{HEAVY}` (cache warm) | {ms['heavy']:.1f} | {m['heavy'] / m['trivial']:.2f}x the trivial trial | at most 1.5x |"
    )
    print(f"| `verify()`, trivial task | {ms['verify']:.1f} | | |")
    print(f"| its verifier script alone | {ms['verifier']:.1f} | | |")
    print(f"| verification overhead | {ms['overhead']:.1f} | | at most 15 ms |")
    print()
    print(f"| bundled tasks ({m['tasks']:.0f}, oracle, {args.concurrency} at once) | trials/min |")
    print("|---|---|")
    print(f"| uncached (`TERMGYM_ENV_CACHE=0`) | {m['uncached']:.0f} |")
    print(f"| cached | {m['cached']:.0f} |")
    print(f"| cached / uncached | {m['cached'] / m['uncached']:.2f}x (target at least 3x) |")


if __name__ == "__main__":
    main()
