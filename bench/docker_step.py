"""The Docker backend, measured side by side in one run.

1. Step latency (medians): ``env.step("true")`` through the persistent shell; ``docker exec C true``
   through the CLI (what most harnesses pay per command); docker-py ``exec_run`` per command; the
   floor, a bare round trip through an already-attached shell in the container. Target: the step at
   most 0.05 of the CLI exec.
2. Trial overhead (medians): create, start, one step, remove through termgym, against
   ``docker run --rm IMAGE true``. Target: at most 1.1 of it. ``stop`` hands the removal to the
   engine in the background; the removal is waited for before the ``docker run`` is timed, and
   the trial with its removal waited for is printed too.
3. Concurrency: 32 trials of a bundled task at 8 at a time: trials per minute, errors, leaks.
4. Warm pool: a step of 32 trials of a trivial task at 8 at a time, without a pool and with one
   (``TERMGYM_DOCKER_POOL``, prewarmed before the step as a trainer does between steps), side by
   side, alternating; bare trials (start, one command, stop) and whole ones (the oracle, then the
   verifier, whose two container restarts and change listing no pool shortens). Target: the step
   with the pool at most 0.5 of the step without.

    .venv/bin/python bench/docker_step.py   (needs the engine: scripts/docker-engine.sh)
"""

from __future__ import annotations

import asyncio
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from termgym.agents import OracleAgent
from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.episode.spec import default_sandbox_factory
from termgym.sandboxes import docker
from termgym.sandboxes.docker import DockerSandbox, FrameDemux, docker_client
from termgym.tasks import load_task
from termgym.tasks.bundled import bundled_task_path
from termgym.trial import run_trial
from tests.helpers import write_task

POOL_SIZE = 32  # the warm pool's size per image in the pool comparison: one step's trials


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
    ours, removed, plain = [], [], []
    image = None
    for _ in range(count):
        started = time.perf_counter()
        env = AsyncTerminalEnv(task, EnvOptions(backend="docker"))
        async with env:
            await env.reset()
            await env.step("true")
            image = image or docker_client().api.inspect_container(container_of(env))["Image"]
        ours.append(time.perf_counter() - started)
        docker.wait_for_removals()  # the engine is idle again before docker run is timed
        removed.append(time.perf_counter() - started)
        started = time.perf_counter()
        subprocess.run(["docker", "run", "--rm", "--network", "none", image, "true"], check=True)
        plain.append(time.perf_counter() - started)
    return {"ours": median_ms(ours), "removed": median_ms(removed), "plain": median_ms(plain)}


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
    await docker.close_shared()  # the removals stop() started
    leaked = docker_client().api.containers(all=True, filters={"label": "termgym.run=bench-concurrency"})
    return {
        "per_minute": trials / elapsed * 60,
        "errors": sum(r.error is not None for r in records),
        "resolved": sum(r.resolved for r in records),
        "leaked": len(leaked),
        "elapsed": elapsed,
    }


async def pool_step(task_dir: Path, trials: int, limit: int, pool: int, *, verified: bool) -> dict[str, float]:
    """One step of ``trials`` trials of a trivial task at ``limit`` at a time: whole trials (the
    oracle, then the verifier) when ``verified``, else bare ones (start, one command, stop). With
    ``pool`` > 0, a warm pool of that many per image, prewarmed before the step is timed.
    Everything is removed (the pool closed) before it returns."""
    os.environ["TERMGYM_DOCKER_POOL"] = str(pool)
    os.environ["TERMGYM_DOCKER_POOL_TOTAL"] = str(max(pool, 1))
    task = load_task(task_dir)
    options = EnvOptions(backend="docker", run_id="bench-pool")
    prewarm = time.perf_counter()
    ready = await docker.prewarm([default_sandbox_factory(task, options).spec])
    prewarm = time.perf_counter() - prewarm
    gate = asyncio.Semaphore(limit)

    async def one() -> bool:
        async with gate:
            if verified:
                record = await run_trial(task, OracleAgent(), options)
                return record.error is None and record.resolved
            env = AsyncTerminalEnv(task, options)
            async with env:
                await env.reset()
                _, _, _, _, info = await env.step("true")
                return info.get("exit_code") == 0

    started = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(trials)))
    elapsed = time.perf_counter() - started
    await docker.close_shared()
    leaked = docker_client().api.containers(all=True, filters={"label": "termgym.run=bench-pool"})
    return {"elapsed": elapsed, "prewarm": prewarm, "ready": ready, "ok": sum(results), "leaked": len(leaked)}


def pool_comparison(task_dir: Path, rounds: int, pool: int, *, verified: bool) -> dict[str, dict[str, float]]:
    """``pool_step`` without and with the pool, alternating for ``rounds``; the run with the
    median step time of each (``cold``, ``warm``)."""
    cold, warm = [], []
    for _ in range(rounds):
        cold.append(asyncio.run(pool_step(task_dir, 32, 8, 0, verified=verified)))
        warm.append(asyncio.run(pool_step(task_dir, 32, 8, pool, verified=verified)))
    os.environ.pop("TERMGYM_DOCKER_POOL")
    os.environ.pop("TERMGYM_DOCKER_POOL_TOTAL")

    def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
        return sorted(runs, key=lambda r: r["elapsed"])[len(runs) // 2]

    return {"cold": median_run(cold), "warm": median_run(warm)}


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        task_dir = write_task(Path(root))
        latency = asyncio.run(step_latencies(task_dir, 300))
        overhead = asyncio.run(trial_overhead(task_dir, 15))
        asyncio.run(run_trial(load_task(task_dir), OracleAgent(), EnvOptions(backend="docker")))  # the build
        bare = pool_comparison(task_dir, 3, POOL_SIZE, verified=False)
        whole = pool_comparison(task_dir, 3, POOL_SIZE, verified=True)
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
    print(f"| the same, its removal waited for | {overhead['removed']:.1f} |")
    print(f"| `docker run --rm IMAGE true` | {overhead['plain']:.1f} |")
    print()
    print(f"termgym / docker run = {overhead['ours'] / overhead['plain']:.2f} (target <= 1.1)")
    print(f"termgym with its removal waited for / docker run = {overhead['removed'] / overhead['plain']:.2f}")
    print()
    print("| step of 32 trials at -n 8 (median of 3 each) | s | ok | containers leaked | prewarm before the step |")
    print("|---|---|---|---|---|")
    for label, runs in (
        ("trivial trials (start, one command, stop)", bare),
        ("whole trials (oracle + verifier)", whole),
    ):
        for name, run in (("without a pool", runs["cold"]), (f"warm pool of {POOL_SIZE}", runs["warm"])):
            prewarmed = f"{run['prewarm']:.2f}s, {run['ready']} ready" if run["ready"] else "-"
            print(f"| {label}, {name} | {run['elapsed']:.2f} | {run['ok']}/32 | {run['leaked']} | {prewarmed} |")
    print()
    for label, runs in (("trivial trials", bare), ("whole trials", whole)):
        ratio = runs["warm"]["elapsed"] / runs["cold"]["elapsed"]
        print(f"step with pool / without, {label} = {ratio:.2f} (target <= 0.5)")
    print()
    print(
        f"concurrency: 32 trials at -n 8 in {load['elapsed']:.1f}s = {load['per_minute']:.0f} trials/min; "
        f"resolved {load['resolved']}/32, errors {load['errors']}, containers leaked {load['leaked']}"
    )


if __name__ == "__main__":
    main()
