"""What a command costs through termgym's framework integrations, measured side by side in one run.

Per backend (embedded, and Docker when its engine answers), the median and p90 of one trivial
command (``true``) run four ways in the same kind of sandbox:

- ``step``: termgym's own ``env.step("true")`` through the persistent shell (the baseline);
- ``skyrl``: ``TermgymEnv.step`` with a fenced ``true`` block: SkyRL's synchronous call, the hop to
  termgym's shared loop, the parse and the observation on top of the step;
- ``inspect``: ``TermgymSandboxEnvironment.exec(["true"])``: inspect's sandbox API, a fresh process
  under the stream-splitting wrapper (``termgym.integrations.sandbox_io``);
- ``inspect local``: inspect's own ``local`` provider, a bare subprocess on the host with no sandbox
  at all (embedded row only): the floor of inspect's API.

Ratios are to ``step``. No target is set: the figures say what each integration adds.

    .venv/bin/python bench/frameworks.py [--commands 200] [--docker-commands 40]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.step_latency import timed
from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from tests.helpers import write_task

WARMUP = 10


async def measure_step(task_dir: Path, backend: str, count: int) -> list[float]:
    env = AsyncTerminalEnv(load_task(task_dir), EnvOptions(backend=backend, max_turns=count + 100))
    async with env:
        await env.reset()
        return await timed(lambda: env.step("true"), count, warmup=WARMUP)


def measure_skyrl(task_dir: Path, backend: str, count: int) -> list[float]:
    import skyrl_gym

    import termgym.integrations.skyrl  # noqa: F401  (registers the id)

    env = skyrl_gym.make("termgym", extras={"task": str(task_dir), "backend": backend, "max_turns": count + 100})
    try:
        env.init([])
        reply = "```bash\ntrue\n```"
        for _ in range(WARMUP):
            env.step(reply)
        samples = []
        for _ in range(count):
            started = time.perf_counter()
            env.step(reply)
            samples.append(time.perf_counter() - started)
        return samples
    finally:
        env.close()


async def measure_inspect(task_dir: Path, backend: str, count: int) -> list[float]:
    from termgym.integrations.inspect import TermgymSandboxConfig, TermgymSandboxEnvironment

    config = TermgymSandboxConfig(task=str(task_dir), backend=backend)
    return await measure_provider(TermgymSandboxEnvironment, config, count)


async def measure_inspect_local(count: int) -> list[float]:
    from inspect_ai.util._sandbox.local import LocalSandboxEnvironment

    return await measure_provider(LocalSandboxEnvironment, None, count)


async def measure_provider(provider: Any, config: Any, count: int) -> list[float]:
    """``exec(["true"])`` through an inspect sandbox provider's sample sandbox, timed."""
    environments = await provider.sample_init("bench", config, {})
    try:
        box = environments["default"]
        return await timed(lambda: box.exec(["true"]), count, warmup=WARMUP)
    finally:
        await provider.sample_cleanup("bench", config, environments, False)


def docker_answers() -> bool:
    try:
        from termgym.sandboxes.docker import docker_client

        docker_client()
        return True
    except Exception:
        return False


def row(backend: str, way: str, samples: list[float], baseline: float) -> str:
    median = statistics.median(samples)
    p90 = statistics.quantiles(samples, n=10)[-1]
    return f"| {backend} | {way} | {median * 1000:.2f} | {p90 * 1000:.2f} | {median / baseline:.2f} |"


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commands", type=int, default=200, help="commands per way on the embedded backend")
    parser.add_argument("--docker-commands", type=int, default=40, help="commands per way on Docker")
    args = parser.parse_args()
    task_dir = write_task(Path(tempfile.mkdtemp(prefix="termgym-bench-")))
    print("| backend | way | median ms | p90 ms | x step |")
    print("|---|---|---|---|---|")
    backends = [("local", args.commands)] + ([("docker", args.docker_commands)] if docker_answers() else [])
    for backend, count in backends:
        step = asyncio.run(measure_step(task_dir, backend, count))
        baseline = statistics.median(step)
        print(row(backend, "step", step, baseline), flush=True)
        print(row(backend, "skyrl", measure_skyrl(task_dir, backend, count), baseline), flush=True)
        print(row(backend, "inspect", asyncio.run(measure_inspect(task_dir, backend, count)), baseline), flush=True)
        if backend == "local":
            print(row("host", "inspect local", asyncio.run(measure_inspect_local(count)), baseline), flush=True)
    if len(backends) == 1:
        print("(Docker did not answer: its rows are missing)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
