"""The cost of sandboxes on a Ray node (``--cluster``) against the same backend on this machine,
measured side by side in one run on a one-node cluster on loopback.

1. A step: ``env.step("true")`` through the persistent shell, local and remote (one call on the
   node's actor: the command's write, which brings the output back): median and p90, and the added
   latency; beside it, the round trip of the cheapest calls on the node's actor, without an
   argument and with one, the floors of any remote operation.
2. A trivial trial (the oracle on a two-assertion task): wall time and the driver's CPU per trial
   (this process's CPU time, Ray's threads included; the sandboxes' own processes are not the driver's).
3. Memory on the driver per live remote sandbox: the driver's RSS growth over ``--live`` sandboxes
   started and held at once, divided by their number.

Targets (issue 35): added latency per command at most 1 ms median; the driver's CPU per remote
trial at most 2x the local one; at most 2 MiB per live remote sandbox on the driver.

    .venv/bin/python bench/ray_remote.py [--steps 300] [--trials 20] [--live 32] [--address HOST:PORT]

Without ``--address`` it starts a one-node cluster itself (``ray start --head`` on 127.0.0.1) and
ends the processes it started at the end (by their ids; not ``ray stop``, which would end a cluster of
the user's own on this machine too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.step_latency import timed
from termgym.agents import OracleAgent
from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import write_task
from tests.ray_cluster import end_sessions, free_port, start_head


@contextlib.contextmanager
def one_node_cluster(address: str | None) -> Iterator[str]:
    """``address``, else a one-node cluster started here (in a session of its own) and ended at the
    end by its processes' ids: a Ray cluster of the user's own on this machine is left running."""
    if address:
        yield address
        return
    port, temp = free_port(), f"/tmp/tg-ray-bench-{os.getpid()}"
    session = start_head(port, temp, cpus=2)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        left = end_sessions([session])
        subprocess.run(["rm", "-rf", temp], check=False)
        if left:
            print(f"processes of the bench's Ray cluster still running: {left}", file=sys.stderr)


@contextlib.contextmanager
def without_exchange() -> Iterator[None]:
    """Remote channels as before the relay's exchange: the command's write one call, its output
    brought by the long poll (each batch a call): the same step, for a side-by-side row."""
    from termgym.sandboxes.base import ProcessChannel
    from termgym.sandboxes.ray.remote import RemoteChannel

    RemoteChannel.write_expecting = ProcessChannel.write_expecting  # type: ignore[method-assign]
    try:
        yield
    finally:
        del RemoteChannel.write_expecting


async def step_times(task_dir: Path, options: EnvOptions, steps: int) -> list[float]:
    env = AsyncTerminalEnv(load_task(task_dir), options)
    async with env:
        await env.reset()
        return await timed(lambda: env.step("true"), steps)


async def trial_costs(task_dir: Path, options: EnvOptions, trials: int) -> tuple[float, float]:
    """Median wall seconds and mean driver CPU seconds per trial."""
    task = load_task(task_dir)
    await run_trial(task, OracleAgent(), options)  # warm: the environment prepared, the files shipped
    walls, cpu_start = [], time.process_time()
    for _ in range(trials):
        started = time.perf_counter()
        record = await run_trial(task, OracleAgent(), options)
        assert record.resolved, record.error
        walls.append(time.perf_counter() - started)
    return statistics.median(walls), (time.process_time() - cpu_start) / trials


def rss_mib() -> float:
    with open(f"/proc/{os.getpid()}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


async def memory_per_sandbox(task_dir: Path, options: EnvOptions, live: int) -> float:
    """The driver's RSS growth per live remote sandbox (started, shell open), in MiB."""
    envs = [AsyncTerminalEnv(load_task(task_dir), options) for _ in range(live)]
    warm = AsyncTerminalEnv(load_task(task_dir), options)
    async with warm:
        await warm.reset()
    before = rss_mib()
    try:
        for env in envs:
            await env.reset()
        after = rss_mib()
    finally:
        await asyncio.gather(*(env.close() for env in envs))
    return (after - before) / live


async def ping_times(address: str, count: int, *, argument: bool) -> list[float]:
    """Round trips of the cheapest call on a node's actor, without an argument (``info``) or with one
    (``has_files``): what any remote operation costs at least."""
    from termgym.sandboxes.ray.cluster import connect

    node = connect(address, "local").list()[0]
    return await timed(lambda: node.actor.has_files.remote("0" * 32) if argument else node.actor.info.remote(), count)


def stats(samples: list[float]) -> tuple[float, float]:
    return statistics.median(samples) * 1000, statistics.quantiles(samples, n=10)[-1] * 1000


async def measure(address: str, args: argparse.Namespace) -> None:
    from termgym.sandboxes import close_backends

    task_dir = write_task(Path(tempfile.mkdtemp(prefix="termgym-bench-")))
    local = EnvOptions(max_turns=args.steps + 100)
    remote = EnvOptions(max_turns=args.steps + 100, cluster=address)
    try:
        local_steps = await step_times(task_dir, local, args.steps)
        remote_steps = await step_times(task_dir, remote, args.steps)
        with without_exchange():
            polled_steps = await step_times(task_dir, remote, args.steps)
        (lm, lp), (rm, rp), (om, op) = stats(local_steps), stats(remote_steps), stats(polled_steps)
        pm, pp = stats(await ping_times(address, args.steps, argument=False))
        am, ap = stats(await ping_times(address, args.steps, argument=True))
        print("| what | local | remote (Ray, loopback) | remote - local | remote / local |")
        print("|---|---|---|---|---|")
        print(f"| step median, ms | {lm:.2f} | {rm:.2f} | {rm - lm:.2f} | {rm / lm:.1f} |")
        print(f"| step p90, ms | {lp:.2f} | {rp:.2f} | {rp - lp:.2f} | {rp / lp:.1f} |")
        print(
            f"| step median without the exchange (write, then polls), ms | {lm:.2f} | {om:.2f} | {om - lm:.2f} | {om / lm:.1f} |"
        )
        print(f"| step p90 without the exchange, ms | {lp:.2f} | {op:.2f} | {op - lp:.2f} | {op / lp:.1f} |")
        print(f"| one call on the node's actor, no argument, median / p90 ms | | {pm:.2f} / {pp:.2f} | | |")
        print(
            f"| one call with an argument (the floor of a step's one call), median / p90 ms | | {am:.2f} / {ap:.2f} | | |",
            flush=True,
        )
        local_wall, local_cpu = await trial_costs(task_dir, local, args.trials)
        remote_wall, remote_cpu = await trial_costs(task_dir, remote, args.trials)
        print(
            f"| trial wall median, ms | {local_wall * 1000:.1f} | {remote_wall * 1000:.1f} | "
            f"{(remote_wall - local_wall) * 1000:.1f} | {remote_wall / local_wall:.2f} |"
        )
        print(
            f"| driver CPU per trial, ms | {local_cpu * 1000:.1f} | {remote_cpu * 1000:.1f} | "
            f"{(remote_cpu - local_cpu) * 1000:.1f} | {remote_cpu / local_cpu:.2f} |",
            flush=True,
        )
        per_sandbox = await memory_per_sandbox(task_dir, remote, args.live)
        print(f"| driver RSS per live remote sandbox, MiB ({args.live} live) | | {per_sandbox:.2f} | | |")
    finally:
        await close_backends()


def main() -> int:
    parser = argparse.ArgumentParser(
        description="remote (Ray) against local sandboxes: step, trial, driver CPU and memory"
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--live", type=int, default=32)
    parser.add_argument("--address", default=None, help="an existing cluster (default: start a one-node one)")
    args = parser.parse_args()
    with one_node_cluster(args.address) as address:
        asyncio.run(measure(address, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
