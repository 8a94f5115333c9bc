"""How an embedded sandbox's start scales with the sandboxes already alive (issue 43, "Scale on one
machine"), through the public API.

One run starts ``--max`` sandboxes of a bundled task (``--task``, its storage an ext4 image on a
loop device over the prepared environment's overlay) with ``termgym.make(...).reset()``,
``--concurrency`` at a time, with an agent timeout long enough that every one stays alive to the
end; each start's latency is recorded in the order the starts began. At each rung of the ladder
(8, 64, 256, 512, 1024, up to ``--max``), once that many are alive:

- the median start of the first 64 and of the last 64 started so far (fewer below 64);
- the wall time to start them all so far, divided by their number;
- memory per live sandbox: the PSS (``/proc/PID/smaps_rollup``) of every process this one started
  (bubblewrap, the keeper and its spare, each episode's shell), the growth of this process's own
  PSS (the driver: asyncio, the env, child-watcher threads), and the growth of the kernel's own
  memory as ``/proc/meminfo`` counts it (slab, kernel stacks, page tables: mounts, namespaces, loop
  devices, cgroups, processes), each divided by the live sandboxes; the kernel's figure is the whole
  machine's, so other work on it adds noise;
- one ``echo`` step in every live sandbox at once, seconds.

Target (the issue's): a start with 1,024 alive costs what one among the first 64 does (last / first
at 1), at most 4 MiB per live sandbox.

Also, side by side, what one keeper's namespace costs the kernel: a ``bwrap ... true`` spawn
(``bench/step_latency.py``'s) and the number of mounts this process's namespace holds, at the
first and the last rung; the spawn both from this process (which holds every live sandbox's
descriptors: a fork copies its descriptor table and the child closes every entry) and from a fresh
process holding three, so that the kernel's own growth and the driver's show apart.

Every sandbox, mount, cgroup and process it made is gone when it ends, on Ctrl-C, a SIGTERM or an
error too (the env's ``close``, then ``termgym gc``'s collection on its own sandbox directory; it
says so if anything is left). The soft limit on open files is raised to the hard limit (each
sandbox holds about nine descriptors here: pipes, its mount namespace, its directory, a lock).

    .venv/bin/python bench/embedded_scale.py [--max 1024] [--concurrency 8] [--task file-ops/bulk-rename]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import termgym
from bench.step_latency import measure_spawn
from termgym.env import AsyncTerminalEnv
from termgym.sandboxes import close_backends
from termgym.sandboxes.local.env_cache import EnvCache
from termgym.sandboxes.local.leftovers import collect_garbage

LADDER = (8, 64, 256, 512, 1024)
WINDOW = 64  # starts in the "first" and "last" medians
AGENT_TIMEOUT = 24 * 3600.0  # every sandbox stays alive to the end


@dataclass
class Rung:
    live: int
    first_ms: float
    last_ms: float
    wall_per_ms: float
    processes_mib: float  # PSS of the sandboxes' processes, per sandbox
    driver_mib: float  # this process's PSS growth, per sandbox
    kernel_mib: float  # the kernel's own memory growth (slab, stacks, page tables), per sandbox
    step_s: float
    spawn_ms: float = 0.0
    small_spawn_ms: float = 0.0  # the same spawn from a process of three descriptors
    descriptors: int = 0  # this process's
    mounts: int = 0


@dataclass
class Run:
    starts: list[float] = field(default_factory=list)  # seconds, in the order the starts began
    rungs: list[Rung] = field(default_factory=list)


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def descendants(root: int) -> list[int]:
    """Every process below ``root`` (from each process's parent in ``/proc/PID/stat``)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat[stat.rfind(")") + 2 :].split()[1])
        parents.setdefault(parent, []).append(int(entry))
    found, queue = [], [root]
    while queue:
        for child in parents.get(queue.pop(), []):
            found.append(child)
            queue.append(child)
    return found


def kernel_kib() -> int:
    """The kernel's own memory (``/proc/meminfo``): slab, kernel stacks, page tables."""
    fields = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        fields[name] = int(rest.split()[0])
    return fields["Slab"] + fields["KernelStack"] + fields["PageTables"]


def raise_open_files(needed: int) -> int:
    """The soft limit on open files raised to the hard one; what it is now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    if soft != resource.RLIM_INFINITY and soft < needed:
        print(f"warning: {soft} open files allowed, about {needed} needed", file=sys.stderr)
    return soft


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3 if values else 0.0


async def measure(args: argparse.Namespace, run: Run) -> None:
    ladder = [n for n in LADDER if n < args.max] + [args.max]
    envs: list[AsyncTerminalEnv] = []
    limit = asyncio.Semaphore(args.concurrency)
    main_task = asyncio.current_task()
    assert main_task is not None  # run by asyncio.run
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main_task.cancel)  # as Ctrl-C does
    before_driver, before_kernel = pss_kib(os.getpid()), kernel_kib()

    async def start(index: int) -> None:
        env = termgym.make(args.task, backend="local", agent_timeout=AGENT_TIMEOUT)
        async with limit:
            envs.append(env)  # closed at the end whatever happens to its start
            started = time.perf_counter()
            await env.reset()
            run.starts[index] = time.perf_counter() - started

    try:
        warm = termgym.make(args.task, backend="local", agent_timeout=AGENT_TIMEOUT)
        async with warm:  # the prepared environment made, this process warm: not timed
            await warm.reset()
        before_driver, before_kernel = pss_kib(os.getpid()), kernel_kib()
        wall = 0.0
        for live in ladder:
            count = len(run.starts)
            run.starts += [0.0] * (live - count)
            began = time.perf_counter()
            async with asyncio.TaskGroup() as group:  # one failed start cancels the rest (each cleans up)
                for index in range(count, live):
                    group.create_task(start(index))
            wall += time.perf_counter() - began
            processes = sum(pss_kib(pid) for pid in descendants(os.getpid()))
            driver, kernel = pss_kib(os.getpid()) - before_driver, kernel_kib() - before_kernel
            began = time.perf_counter()
            async with asyncio.TaskGroup() as group:
                steps = [group.create_task(env.step("echo scale")) for env in envs]
            step = time.perf_counter() - began
            bad = [
                info for _, _, _, _, info in (s.result() for s in steps) if info.get("output", "").strip() != "scale"
            ]
            if bad:
                raise SystemExit(f"{len(bad)} of {live} steps did not echo: {bad[0]}")
            rung = Rung(
                live=live,
                first_ms=median_ms(run.starts[:WINDOW]),
                last_ms=median_ms(run.starts[-WINDOW:]),
                wall_per_ms=wall / live * 1e3,
                processes_mib=processes / 1024 / live,
                driver_mib=driver / 1024 / live,
                kernel_mib=kernel / 1024 / live,
                step_s=step,
            )
            if live in (ladder[0], ladder[-1]):
                rung.spawn_ms = await asyncio.to_thread(measure_spawn, 5) * 1e3
                rung.small_spawn_ms = await asyncio.to_thread(spawn_from_a_small_process, 5)
                rung.descriptors = len(os.listdir("/proc/self/fd"))
                rung.mounts = len(Path("/proc/self/mountinfo").read_text().splitlines())
            run.rungs.append(rung)
            print(
                f"{live} live: first {rung.first_ms:.0f} ms, last {rung.last_ms:.0f} ms, "
                f"wall/N {rung.wall_per_ms:.0f} ms, step {rung.step_s:.2f} s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        await asyncio.gather(*(env.close() for env in envs), return_exceptions=True)
        await close_backends()


def report(args: argparse.Namespace, run: Run) -> None:
    print(f"| live sandboxes | median start, first {WINDOW} | median start, last {WINDOW} | last / first |", end="")
    print(" wall / N | memory each: processes + driver + kernel | one `echo` in all at once |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in run.rungs:
        total = r.processes_mib + r.driver_mib + r.kernel_mib
        memory = f"{total:.1f} MiB ({r.processes_mib:.1f} + {r.driver_mib:.1f} + {r.kernel_mib:.1f})"
        ratio = r.last_ms / r.first_ms if r.first_ms else 0.0
        print(
            f"| {r.live} | {r.first_ms:.0f} ms | {r.last_ms:.0f} ms | {ratio:.2f} | {r.wall_per_ms:.0f} ms | {memory} |"
            f" {r.step_s:.2f} s |"
        )
    print()
    print("| live sandboxes | mounts in this namespace | descriptors of this process |", end="")
    print(" `bwrap ... true` spawn from it (median) | the same from a process of 3 descriptors |")
    print("|---:|---:|---:|---:|---:|")
    for r in run.rungs:
        if r.mounts:
            print(f"| {r.live} | {r.mounts} | {r.descriptors} | {r.spawn_ms:.1f} ms | {r.small_spawn_ms:.1f} ms |")
    print()
    print(f"{args.concurrency} starting at a time; task {args.task}; {os.cpu_count()} CPUs")


def spawn_from_a_small_process(count: int) -> float:
    """``measure_spawn(count)`` in milliseconds, run by a fresh Python that holds descriptors 0, 1
    and 2 only (``close_fds``, the default)."""
    code = f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r}); "
    code += f"from bench.step_latency import measure_spawn; print(measure_spawn({count}) * 1e3)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(done.stdout)


def leftovers(sandbox_dir: Path) -> list[str]:
    """What of this run is still on the host: directories, mounts, processes."""
    found = [str(path) for path in sandbox_dir.glob("tg-*")]
    found += [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(sandbox_dir) in line]
    found += [f"process {pid}" for pid in descendants(os.getpid())]
    return found


def main() -> None:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=1024, help="live sandboxes at the last rung")
    parser.add_argument("--concurrency", type=int, default=8, help="starts at a time")
    parser.add_argument("--task", default="file-ops/bulk-rename", help="a bundled task's name or a task directory")
    args = parser.parse_args()
    if args.max < 1 or args.concurrency < 1:
        raise SystemExit("--max and --concurrency must be at least 1")
    raise_open_files(16 * args.max + 1024)
    run = Run()
    interrupted = False
    with tempfile.TemporaryDirectory(prefix="termgym-scale-") as scratch:
        os.chmod(scratch, 0o711)  # the sandboxes' unprivileged users reach their directories through it
        sandbox_dir, cache = Path(scratch) / "sandboxes", Path(scratch) / "cache"
        os.environ["TERMGYM_SANDBOX_DIR"] = str(sandbox_dir)  # its own: what is left is this run's
        os.environ["TERMGYM_ENV_CACHE_DIR"] = str(cache)
        try:
            asyncio.run(measure(args, run))
        except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C, a kill: every sandbox closed meanwhile
            interrupted = True
        finally:
            collect_garbage(sandbox_dir)
            EnvCache.from_environment().clear()
            left = leftovers(sandbox_dir)
            if left:
                print(f"left behind ({len(left)}): {left[:5]}", file=sys.stderr)
    if interrupted:
        raise SystemExit("interrupted" + (f"; left behind: {len(left)}" if left else "; nothing left behind"))
    report(args, run)
    if left:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
