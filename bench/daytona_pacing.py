"""Daytona creation pacing at scale: 560 trials of a short task through the real SDK against the
local Daytona API server (tests/termgym/sandboxes/daytona/server.py, run in its own process), with a simulated
create latency (a new sandbox stays "creating" for a while, as in the cloud).

Prints one table: creation throughput against the configured pace (target: within 5% of 6/s),
the most creates the server saw in any 1 s and any 60 s window (must not exceed 6 and 600),
outcomes, and leaks (sandboxes left on the server, sandbox directories left on disk).

    .venv/bin/python bench/daytona_pacing.py [--trials 560] [--create-latency 1.0] [--429-rate 0]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from termgym.agents import OracleAgent  # noqa: E402
from termgym.episode.options import EnvOptions  # noqa: E402
from termgym.records import TrialRecord  # noqa: E402
from termgym.sandboxes.daytona.provider import DaytonaSettings, close_providers, get_provider  # noqa: E402
from termgym.sandboxes.pacing import max_in_any_window  # noqa: E402
from termgym.tasks import load_task  # noqa: E402
from termgym.trial import run_trial  # noqa: E402
from tests.helpers import write_task  # noqa: E402


async def start_server(workdir: Path, latency: float, rate_429: float) -> tuple[asyncio.subprocess.Process, str]:
    port_file = workdir / "port"
    env = {**os.environ, "TERMGYM_SANDBOX_DIR": str(workdir / "sandboxes")}
    log = open(workdir / "server.log", "wb")
    server = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.termgym.sandboxes.daytona.server",
        str(port_file),
        "--create-latency",
        str(latency),
        "--429-rate",
        str(rate_429),
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=log,
    )
    for _ in range(300):
        if port_file.exists() and port_file.read_text():
            return server, f"http://127.0.0.1:{port_file.read_text()}"
        await asyncio.sleep(0.05)
    server.kill()
    raise SystemExit(f"the local Daytona server did not start (see {workdir / 'server.log'})")


def stats(base: str) -> dict:
    request = urllib.request.Request(f"{base}/_fake/stats", headers={"Authorization": "Bearer test-key"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.load(response)


async def bench(trials: int, latency: float, rate_429: float, concurrency: int, per_second: int = 6) -> int:
    """Run the bench in a scratch directory that is removed afterwards, whatever happens."""
    workdir, home = Path(tempfile.mkdtemp(prefix="daytona-bench-")), os.getcwd()
    try:
        return await _bench_in(workdir, trials, latency, rate_429, concurrency, per_second)
    finally:
        os.chdir(home)
        shutil.rmtree(workdir, ignore_errors=True)


async def _bench_in(
    workdir: Path, trials: int, latency: float, rate_429: float, concurrency: int, per_second: int
) -> int:
    server, base = await start_server(workdir, latency, rate_429)
    os.environ.update(DAYTONA_API_KEY="test-key", DAYTONA_API_URL=f"{base}/api")
    os.chdir(workdir)
    settings = DaytonaSettings(create_timeout=120.0, per_second=per_second)
    provider = get_provider(settings)
    task = load_task(write_task(workdir / "tasks", name="short"))
    gate = asyncio.Semaphore(concurrency)

    async def one() -> TrialRecord:
        async with gate:
            return await run_trial(task, OracleAgent(), EnvOptions(backend="daytona", run_id="bench"))

    started = time.monotonic()
    try:
        try:
            records = await asyncio.gather(*(one() for _ in range(trials)))
        finally:
            await close_providers()
        wall = time.monotonic() - started
        seen = stats(base)
    finally:
        server.send_signal(signal.SIGTERM)
        await server.wait()

    times = sorted(seen["create_times"])
    statuses = seen["create_statuses"]
    ok_times = sorted(t for t, s in zip(seen["create_times"], statuses, strict=True) if s == 200)
    span = ok_times[-1] - ok_times[0] if len(ok_times) > 1 else float("nan")
    throughput = (len(ok_times) - 1) / span if span == span and span > 0 else float("nan")
    attempts_rate = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else float("nan")
    target = settings.per_second
    per_second, per_minute = max_in_any_window(times, 1.0), max_in_any_window(times, 60.0)
    setups = [r.timings.get("setup", 0.0) for r in records if r.error is None]
    leaked_dirs = list((workdir / "sandboxes").glob("tg-*")) if (workdir / "sandboxes").exists() else []
    errors = sum(1 for r in records if r.error)
    resolved = sum(1 for r in records if r.resolved)
    ratio = throughput / target
    rows = [
        ("trials", f"{trials} (concurrency cap {concurrency}, create latency {latency:g} s, 429 rate {rate_429:g})"),
        ("resolved / errors", f"{resolved} / {errors}"),
        (
            "create attempts (200 / 429 / other)",
            f"{len(times)} ({statuses.count(200)} / {statuses.count(429)} / {len(times) - statuses.count(200) - statuses.count(429)})",
        ),
        ("pacer grants", f"{provider.pacer.granted}"),
        ("configured pace", f"{settings.per_second}/s and {settings.per_minute}/min (guard {settings.pace_guard:g} s)"),
        (
            "creation throughput (successful)",
            f"{throughput:.3f}/s = {ratio:.1%} of {target}/s ({'within' if abs(1 - ratio) <= 0.05 else 'NOT within'} 5%)",
        ),
        ("attempt rate (all creates)", f"{attempts_rate:.3f}/s"),
        (
            "max creates in any 1 s window",
            f"{per_second} (limit {settings.per_second}) {'ok' if per_second <= settings.per_second else 'VIOLATION'}",
        ),
        (
            "max creates in any 60 s window",
            f"{per_minute} (limit {settings.per_minute}) {'ok' if per_minute <= settings.per_minute else 'VIOLATION'}",
        ),
        (
            "trial setup p50 / p95 (incl. pacer wait)",
            f"{statistics.median(setups):.2f} s / {statistics.quantiles(setups, n=20)[18]:.2f} s"
            if len(setups) > 1
            else "n/a",
        ),
        ("snapshot builds", f"{seen['snapshot_builds']}"),
        ("sandboxes left on the server", f"{seen['live']}"),
        ("sandbox directories left on disk", f"{len(leaked_dirs)}"),
        ("wall time", f"{wall:.1f} s ({seen['requests']} API requests)"),
    ]
    width = max(len(name) for name, _ in rows)
    print(f"\nDaytona creation pacing: {trials} trials through daytona=={_sdk_version()} against the local API server")
    print("-" * (width + 60))
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    healthy = (
        per_second <= settings.per_second and per_minute <= settings.per_minute and not seen["live"] and not leaked_dirs
    )
    return 0 if healthy and abs(1 - ratio) <= 0.05 and not errors else 1


def _sdk_version() -> str:
    from importlib.metadata import version

    return version("daytona")


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=560)
    parser.add_argument("--create-latency", type=float, default=1.0, help="seconds a new sandbox stays 'creating'")
    parser.add_argument("--429-rate", dest="rate_429", type=float, default=0.0, help="fraction of creates answered 429")
    parser.add_argument("--concurrency", type=int, default=94, help="trials in flight at once")
    parser.add_argument("--per-second", type=int, default=6, help="the configured pace")
    args = parser.parse_args()
    return asyncio.run(bench(args.trials, args.create_latency, args.rate_429, args.concurrency, args.per_second))


if __name__ == "__main__":
    sys.exit(main())
