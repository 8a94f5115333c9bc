"""The Docker backend, measured side by side in one run.

1. Step latency (medians): ``env.step("true")`` through the persistent shell; ``docker exec C true``
   through the CLI (what most harnesses pay per command); docker-py ``exec_run`` per command; the
   floor, a bare round trip through an already-attached shell in the container. Target: the step at
   most 0.05 of the CLI exec.
2. Trial overhead (medians): create, start, one step, remove through termgym, against
   ``docker run --rm IMAGE true``. Target: at most 1.25 of it.
3. Concurrency: 32 trials of a bundled task at 8 at a time: trials per minute, errors, leaks.

    .venv/bin/python bench/docker_step.py   (needs the engine: scripts/docker-engine.sh)
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from termgym.agents import OracleAgent  # noqa: E402
from termgym.bundled import bundled_task_path  # noqa: E402
from termgym.env import AsyncTerminalEnv, EnvOptions  # noqa: E402
from termgym.sandboxes.docker import DockerSandbox, FrameDemux, docker_client  # noqa: E402
from termgym.tasks import load_task  # noqa: E402
from termgym.trial import run_trial  # noqa: E402
from tests.helpers import write_task  # noqa: E402


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def container_of(env: AsyncTerminalEnv) -> str:
    """The container of ``env``'s sandbox (a Docker one, started by ``reset``)."""
    sandbox = env.sandbox
    assert isinstance(sandbox, DockerSandbox) and sandbox._container is not None
    return sandbox._container


async def step_latencies(task_dir: Path, steps: int) -> dict[str, float]:
    client = docker_client()
    env = AsyncTerminalEnv(load_task(task_dir), EnvOptions(backend="docker", max_turns=steps + 100))
    async with env:
        await env.reset()
        container = container_of(env)
        for _ in range(20):
            await env.step("true")
        step = []
        for _ in range(steps):
            started = time.perf_counter()
            await env.step("true")
            step.append(time.perf_counter() - started)
        cli, sdk = [], []
        for _ in range(30):
            started = time.perf_counter()
            subprocess.run(["docker", "exec", container, "true"], check=True)
            cli.append(time.perf_counter() - started)
            started = time.perf_counter()
            client.containers.get(container).exec_run(["true"])
            sdk.append(time.perf_counter() - started)
        floor = bare_round_trip(client, container)
    return {"step": median_ms(step), "cli": median_ms(cli), "sdk": median_ms(sdk), "floor": floor}


def bare_round_trip(client, container: str) -> float:
    exec_id = client.api.exec_create(container, ["/bin/sh"], stdin=True)["Id"]
    raw = client.api.exec_start(exec_id, socket=True)._sock
    demux, samples = FrameDemux(), []
    for i in range(320):
        started = time.perf_counter()
        raw.sendall(b"echo\n")
        got = b""
        while not got:
            got = demux.feed(raw.recv(4096))
        if i >= 20:
            samples.append(time.perf_counter() - started)
    raw.shutdown(socket.SHUT_WR)
    raw.close()
    return median_ms(samples)


async def trial_overhead(task_dir: Path, count: int) -> dict[str, float]:
    task = load_task(task_dir)
    ours, plain = [], []
    image = None
    for _ in range(count):
        started = time.perf_counter()
        env = AsyncTerminalEnv(task, EnvOptions(backend="docker"))
        async with env:
            await env.reset()
            await env.step("true")
            image = image or docker_client().api.inspect_container(container_of(env))["Image"]
        ours.append(time.perf_counter() - started)
        started = time.perf_counter()
        subprocess.run(["docker", "run", "--rm", "--network", "none", image, "true"], check=True)
        plain.append(time.perf_counter() - started)
    return {"ours": median_ms(ours), "plain": median_ms(plain)}


async def concurrency(trials: int, limit: int) -> dict[str, float]:
    path = bundled_task_path("text-processing/word-frequency")
    assert path is not None  # a bundled task
    task = load_task(path)
    await run_trial(task, OracleAgent(), EnvOptions(backend="docker"))  # the build is not timed
    gate = asyncio.Semaphore(limit)

    async def one():
        async with gate:
            return await run_trial(task, OracleAgent(), EnvOptions(backend="docker", run_id="bench-concurrency"))

    started = time.perf_counter()
    records = await asyncio.gather(*(one() for _ in range(trials)))
    elapsed = time.perf_counter() - started
    leaked = docker_client().api.containers(all=True, filters={"label": "termgym.run=bench-concurrency"})
    return {
        "per_minute": trials / elapsed * 60,
        "errors": sum(r.error is not None for r in records),
        "resolved": sum(r.resolved for r in records),
        "leaked": len(leaked),
        "elapsed": elapsed,
    }


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        task_dir = write_task(Path(root))
        latency = asyncio.run(step_latencies(task_dir, 300))
        overhead = asyncio.run(trial_overhead(task_dir, 15))
    load = asyncio.run(concurrency(32, 8))
    print("| step latency (median) | ms |")
    print("|---|---|")
    print(f'| env.step("true"), persistent shell | {latency["step"]:.3f} |')
    print(f"| `docker exec C true` (CLI) | {latency['cli']:.2f} |")
    print(f"| docker-py `exec_run` | {latency['sdk']:.2f} |")
    print(f"| floor: round trip through an attached shell | {latency['floor']:.3f} |")
    print()
    print(f"step / CLI exec = {latency['step'] / latency['cli']:.4f} (target <= 0.05)")
    print(
        f"step / exec_run = {latency['step'] / latency['sdk']:.4f}; step / floor = {latency['step'] / latency['floor']:.2f}"
    )
    print()
    print("| trial overhead (median) | ms |")
    print("|---|---|")
    print(f"| termgym: create, start, one step, remove | {overhead['ours']:.1f} |")
    print(f"| `docker run --rm IMAGE true` | {overhead['plain']:.1f} |")
    print()
    print(f"termgym / docker run = {overhead['ours'] / overhead['plain']:.2f} (target <= 1.25)")
    print()
    print(
        f"concurrency: 32 trials at -n 8 in {load['elapsed']:.1f}s = {load['per_minute']:.0f} trials/min; "
        f"resolved {load['resolved']}/32, errors {load['errors']}, containers leaked {load['leaked']}"
    )


if __name__ == "__main__":
    main()
