"""What one rollout process (the driver) pays per trial, on each backend, measured in one run.

For each backend, in a fresh process of its own (so that memory freed by one backend's trials is
not reused by the next one's), after one warm-up trial (imports, image builds, one-time caches):

1. Memory per live trial: N trials held open at once as a rollout holds them (``reset``: sandbox
   started, the persistent shell open; one ``step``), then N more (2N live). The driver's resident
   memory (VmRSS, after ``gc.collect()``) above the baseline, divided by the trials live; and the
   marginal cost of the second N. Target: at most 2 MiB per live trial.
2. CPU per trial: M full trials (``reset``, two steps, ``SUBMIT`` which verifies, ``close``), C at a
   time. The driver's CPU (``time.process_time``: every thread of this process) per trial, the
   trials/s per core it implies, and separately the CPU of the driver's reaped child processes
   (``RUSAGE_CHILDREN``: the embedded backend's bwrap, nsenter and shells).

Daytona goes through the real ``daytona`` SDK against the project's local Daytona API server
(tests/termgym/sandboxes/daytona/server.py) running in its own process, as bench/daytona_pacing.py
does: its sandboxes, and their CPU, are the server's, not the driver's. A second Daytona row keeps
the SDK's per-request proxy and netrc lookups on (what a provider did before it turned them off,
and still does where the environment names a proxy): the saving, side by side.

    .venv/bin/python bench/driver_cost.py [--backend local,daytona,docker] [--live 32] [--trials 64]
        [--concurrency 8] [--profile]   (docker needs the engine: scripts/docker-engine.sh)

``--profile`` adds, per backend, the driver's top cProfile entries over the full trials and the top
tracemalloc allocation sites of the live trials (slower; its figures are not the table's).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import os
import pstats
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daytona_pacing import start_server  # noqa: E402  (bench/, this script's directory, is on sys.path)

from termgym.env import SUBMIT, AsyncTerminalEnv  # noqa: E402
from termgym.episode.options import EnvOptions  # noqa: E402
from termgym.sandboxes import BACKENDS, close_backends  # noqa: E402
from termgym.tasks import Task, load_task  # noqa: E402
from tests.helpers import write_task  # noqa: E402

MIB = 1024 * 1024
TARGET_MIB = 2.0
RUN_ID = "bench-driver-cost"


def rss_bytes() -> int:
    """This process's resident memory (VmRSS), after a full garbage collection."""
    gc.collect()
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- one backend, in its own process ------------------------------------------------------------


@contextlib.asynccontextmanager
async def daytona_server(workdir: Path) -> AsyncIterator[None]:
    """The local Daytona API server in a process of its own (started as bench/daytona_pacing.py
    starts it, without added latency or 429s), with the SDK's environment pointed at it."""
    server, base = await start_server(workdir, latency=0.0, rate_429=0.0)
    try:
        for name in ("DAYTONA_TARGET", "DAYTONA_JWT_TOKEN", "DAYTONA_ORGANIZATION_ID", "DAYTONA_SERVER_URL"):
            os.environ.pop(name, None)
        os.environ.update(DAYTONA_API_KEY="test-key", DAYTONA_API_URL=f"{base}/api")
        yield
    finally:
        server.send_signal(signal.SIGTERM)
        await server.wait()


async def open_trial(task: Task, backend: str) -> AsyncTerminalEnv:
    """A trial as a rollout holds it: sandbox started, persistent shell open, one step run."""
    env = AsyncTerminalEnv(task, EnvOptions(backend=backend, run_id=RUN_ID))
    try:
        await env.reset()
        _, _, _, truncated, info = await env.step("echo ready")
        if truncated:
            raise SystemExit(f"{backend}: a step failed: {info.get('error')}")
    except BaseException:
        await env.close()
        raise
    return env


async def full_trial(task: Task, backend: str) -> float:
    """reset, two steps, SUBMIT (verification), close; returns the reward."""
    async with AsyncTerminalEnv(task, EnvOptions(backend=backend, run_id=RUN_ID)) as env:
        await env.reset()
        await env.step("echo done > /app/result.txt")
        await env.step("cat /app/result.txt")
        _, reward, terminated, _, info = await env.step(SUBMIT)
        if not terminated or env.error is not None:
            raise SystemExit(f"{backend}: a trial did not verify: {env.error or info}")
        return reward


async def measure_backend(backend: str, live: int, trials: int, concurrency: int, profile: bool) -> dict:
    workdir, home = Path(tempfile.mkdtemp(prefix="driver-cost-")), os.getcwd()
    workdir.chmod(0o711)  # the server's sandboxes live under it, entered by an unprivileged user
    try:
        async with contextlib.AsyncExitStack() as stack:
            if backend == "daytona":
                await stack.enter_async_context(daytona_server(workdir))
                os.chdir(workdir)  # no stray .env file is read by the SDK
            task = load_task(write_task(workdir / "tasks", name="driver-cost"))
            try:
                return await _measure(task, backend, live, trials, concurrency, profile)
            finally:
                await close_backends()
    finally:
        os.chdir(home)
        shutil.rmtree(workdir, ignore_errors=True)


async def _measure(task: Task, backend: str, live: int, trials: int, concurrency: int, profile: bool) -> dict:
    await full_trial(task, backend)  # warm-up: imports, the image, one-time caches, the shared clients
    baseline = rss_bytes()
    first = await asyncio.gather(*(open_trial(task, backend) for _ in range(live)))
    at_n = rss_bytes()
    second = await asyncio.gather(*(open_trial(task, backend) for _ in range(live)))
    at_2n = rss_bytes()
    await asyncio.gather(*(env.close() for env in [*first, *second]))
    del first, second

    gate = asyncio.Semaphore(concurrency)

    async def one() -> float:
        async with gate:
            return await full_trial(task, backend)

    cpu, child, wall = time.process_time(), children_cpu(), time.perf_counter()
    rewards = await asyncio.gather(*(one() for _ in range(trials)))
    cpu, child, wall = time.process_time() - cpu, children_cpu() - child, time.perf_counter() - wall
    figures = {
        "backend": backend,
        "live": live,
        "trials": trials,
        "concurrency": concurrency,
        "baseline_mib": baseline / MIB,
        "mib_per_trial_n": (at_n - baseline) / live / MIB,
        "mib_per_trial_2n": (at_2n - baseline) / (2 * live) / MIB,
        "mib_marginal": (at_2n - at_n) / live / MIB,
        "cpu_per_trial": cpu / trials,
        "children_cpu_per_trial": child / trials,
        "wall_trials_per_s": trials / wall,
        "resolved": sum(1 for r in rewards if r > 0),
    }
    if profile:
        figures["profile"] = await _profile(task, backend, live, trials, gate)
    return figures


async def _profile(task: Task, backend: str, live: int, trials: int, gate: asyncio.Semaphore) -> str:
    """The top allocation sites of ``live`` open trials and the top CPU entries of ``trials`` full
    ones, as text (tracemalloc and cProfile slow the driver down: not the table's figures)."""
    out = io.StringIO()
    tracemalloc.start(25)
    before = tracemalloc.take_snapshot()
    envs = await asyncio.gather(*(open_trial(task, backend) for _ in range(live)))
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    await asyncio.gather(*(env.close() for env in envs))
    stats = after.compare_to(before, "lineno")
    total = sum(s.size_diff for s in stats)
    print(f"tracemalloc: {total / live / 1024:.1f} KiB of Python heap per live trial; top sites:", file=out)
    for stat in stats[:15]:
        print(f"  {stat.size_diff / live / 1024:8.1f} KiB/trial  {stat.traceback[0]}", file=out)

    async def one() -> float:
        async with gate:
            return await full_trial(task, backend)

    profiler = cProfile.Profile()
    profiler.enable()
    await asyncio.gather(*(one() for _ in range(trials)))
    profiler.disable()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    return out.getvalue()


# -- the table ---------------------------------------------------------------------------------------


# The SDK's per-request proxy and netrc lookups kept on (a proxy named, the API bypassing it), for
# the row that shows what turning them off saves (termgym/sandboxes/daytona/provider.py).
SDK_LOOKUPS_ON = {"HTTP_PROXY": "http://127.0.0.1:9", "NO_PROXY": "127.0.0.1"}


def run_worker(backend: str, args: argparse.Namespace, label: str | None = None, env: dict | None = None) -> dict:
    """Measure ``backend`` in a fresh Python process (``env`` added to its environment); its
    figures come back as one JSON line."""
    argv = [sys.executable, __file__, "--worker", backend, "--live", str(args.live), "--trials", str(args.trials)]
    argv += ["--concurrency", str(args.concurrency), *(["--profile"] if args.profile else [])]
    result = subprocess.run(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **(env or {})})
    lines = result.stdout.strip().splitlines()
    if result.returncode != 0 or not lines:
        raise SystemExit(f"{label or backend}: the measurement failed (exit {result.returncode})")
    return {**json.loads(lines[-1]), "backend": label or backend}


def table(rows: list[dict]) -> str:
    live = rows[0]["live"]
    lines = [
        f"| backend | baseline RSS (MiB) | MiB per live trial, {live} live | MiB per live trial, {2 * live} live "
        f"| MiB per trial, marginal | driver CPU per trial (ms) | trials/s per core | child CPU per trial (ms) "
        f"| wall trials/s (concurrency {rows[0]['concurrency']}) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['backend']} | {r['baseline_mib']:.1f} | {r['mib_per_trial_n']:.3f} | {r['mib_per_trial_2n']:.3f} "
            f"| {r['mib_marginal']:.3f} | {r['cpu_per_trial'] * 1e3:.1f} | {1 / r['cpu_per_trial']:.1f} "
            f"| {r['children_cpu_per_trial'] * 1e3:.1f} | {r['wall_trials_per_s']:.2f} |"
        )
    return "\n".join(lines)


def parse_backends(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown backend {', '.join(unknown) or text!r}; choose from {BACKENDS}")
    return names


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", type=parse_backends, default=["local", "daytona", "docker"])
    parser.add_argument("--live", type=int, default=32, help="N: trials held open at once (then 2N)")
    parser.add_argument("--trials", type=int, default=64, help="M: full trials for the CPU figures")
    parser.add_argument("--concurrency", type=int, default=8, help="full trials in flight at once")
    parser.add_argument("--profile", action="store_true", help="also print cProfile and tracemalloc tops")
    parser.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if min(args.live, args.trials, args.concurrency) < 1:
        parser.error("--live, --trials and --concurrency must be at least 1")
    if args.worker:
        figures = asyncio.run(measure_backend(args.worker, args.live, args.trials, args.concurrency, args.profile))
        if "profile" in figures:
            print(f"\n== {args.worker}: driver profile ==\n{figures.pop('profile')}", file=sys.stderr)
        print(json.dumps(figures))
        return 0
    rows = [run_worker(backend, args) for backend in args.backend]
    if "daytona" in args.backend:
        rows.append(run_worker("daytona", args, "daytona, SDK's env lookups on", SDK_LOOKUPS_ON))
    print(f"\nDriver cost per trial ({args.live} then {2 * args.live} live; {args.trials} full trials)\n")
    print(table(rows))
    over = [r["backend"] for r in rows if max(r["mib_per_trial_2n"], r["mib_marginal"]) > TARGET_MIB]
    print(f"\nmemory per live trial target <= {TARGET_MIB:g} MiB: {'over on ' + ', '.join(over) if over else 'met'}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
