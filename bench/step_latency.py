"""Step latency on the embedded backend, measured side by side in one run.

Three medians: ``env.step("true")`` through the persistent shell; spawning a fresh
``bwrap ... true`` sandbox per command (what a harness without a persistent shell pays); and the
floor, a bare pipe round trip to a shell already running in the same sandbox. Target: the step costs
at most 0.25 of the spawn; the gap to the floor is termgym's own overhead.

    .venv/bin/python bench/step_latency.py [--steps 400]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.sandboxes.local import LocalSandbox
from termgym.tasks import load_task
from tests.helpers import write_task


async def timed(run: Callable[[], Awaitable[object]], count: int, *, warmup: int = 20) -> list[float]:
    """Seconds each of ``count`` awaits of ``run()`` took, after ``warmup`` untimed ones (the other
    benchmarks' timing loop too)."""
    for _ in range(warmup):
        await run()
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        await run()
        samples.append(time.perf_counter() - started)
    return samples


async def measure_step(task_dir: Path, steps: int) -> tuple[float, float]:
    env = AsyncTerminalEnv(load_task(task_dir), EnvOptions(max_turns=steps + 100))
    async with env:
        await env.reset()
        samples = await timed(lambda: env.step("true"), steps)
        floor = measure_floor(env)
    return statistics.median(samples), floor


def measure_floor(env: AsyncTerminalEnv) -> float:
    """A bare pipe round trip: write one line to a bash already running in the same sandbox and
    read its one-line answer, with blocking pipes and no framing."""
    sandbox = env.sandbox
    assert isinstance(sandbox, LocalSandbox)  # the embedded backend's, started by reset
    argv = sandbox._enter_argv(["/bin/bash", "--noprofile", "--norc"], {"PATH": "/usr/bin:/bin"}, "/")
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    assert process.stdin is not None and process.stdout is not None  # both piped
    samples = []
    for i in range(300):
        started = time.perf_counter()
        process.stdin.write(b"echo\n")
        process.stdout.readline()
        if i >= 20:
            samples.append(time.perf_counter() - started)
    process.kill()
    process.wait()
    return statistics.median(samples)


def measure_spawn(count: int) -> float:
    with tempfile.TemporaryDirectory() as scratch:
        argv = [
            "bwrap",
            "--unshare-all",
            "--unshare-user",
            "--uid",
            "0",
            "--gid",
            "0",
            "--die-with-parent",
            "--new-session",
            "--ro-bind",
            "/usr",
            "/usr",
            "--ro-bind",
            "/etc",
            "/etc",
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--bind",
            scratch,
            "/app",
            "--",
            "true",
        ]
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            subprocess.run(argv, check=True)
            samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        task = write_task(Path(root))
        spawn = measure_spawn(max(50, args.steps // 4))
        step, floor = asyncio.run(measure_step(task, args.steps))
    print("| measure (median) | ms |")
    print("|---|---|")
    print(f'| env.step("true"), persistent shell | {step * 1e3:.3f} |')
    print(f"| fresh `bwrap ... true` per command | {spawn * 1e3:.3f} |")
    print(f"| floor: bare pipe round trip in the sandbox | {floor * 1e3:.3f} |")
    print()
    print(f"step / spawn = {step / spawn:.3f} (target <= 0.25)")
    print(f"step / floor = {step / floor:.1f} (termgym's own overhead)")


if __name__ == "__main__":
    main()
