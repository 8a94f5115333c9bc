"""The embedded backend on a task image (issue 43), side by side with the host's system and with
Docker on the same image, in one run.

The image is the offline base (``termgym/base:bookworm``) pushed to a real registry on loopback
(Debian's ``docker-registry``) under another name, so the embedded backend copies it with skopeo
and unpacks it with umoci (once, untimed) and Docker pulls it. Rounds interleave every kind (a
noisy neighbour slows all alike); medians:

- a fresh ``bwrap ... true`` spawn (``bench/step_latency.py``'s);
- an ``env.step("true")`` in a sandbox over the host's system and over the image; target at most
  0.25 of the spawn;
- a trivial trial (``bench/embedded_trial.py``'s task: create, one step, verify, remove, the
  prepared environment warm) over the host's system, over the pulled image, and on Docker over
  the same image; target for the image at most 1.5x the host's system.

    .venv/bin/python bench/embedded_images.py [--rounds 15] [--steps 200]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.embedded_trial import trivial_task
from bench.step_latency import measure_spawn, timed
from termgym.agents.basic import ScriptedAgent
from termgym.env import AsyncTerminalEnv, EnvOptions
from termgym.images.build import BASE_IMAGE
from termgym.sandboxes import close_backends
from termgym.tasks import Task, load_task
from termgym.trial import run_trial
from tests.registry import running_registry


def with_from(task: Task, image: str, root: Path) -> Task:
    """``task`` copied under ``root`` with its Dockerfile's ``FROM`` naming ``image``."""
    copy = root / f"{task.name}-{abs(hash(image)) % 10_000}"
    subprocess.run(["cp", "-a", str(task.path), str(copy)], check=True)
    dockerfile = copy / "environment" / "Dockerfile"
    lines = dockerfile.read_text().splitlines()
    dockerfile.write_text("\n".join([f"FROM {image}", *lines[1:]]) + "\n")
    return load_task(copy)


async def trial(task: Task, backend: str) -> float:
    started = time.perf_counter()
    record = await run_trial(task, ScriptedAgent(("true",)), EnvOptions(backend=backend))
    elapsed = time.perf_counter() - started
    if record.error is not None or not record.resolved:
        raise SystemExit(f"{task.name} on {backend}: {record.error or 'not resolved'}")
    return elapsed


async def step(task: Task, steps: int) -> float:
    env = AsyncTerminalEnv(task, EnvOptions(max_turns=steps + 100))
    async with env:
        await env.reset()
        return statistics.median(await timed(lambda: env.step("true"), steps))


async def measure(args: argparse.Namespace, root: Path, registry: str) -> dict[str, float]:
    ref = f"{registry}/bench/base:1"
    subprocess.run(
        ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"docker-daemon:{BASE_IMAGE}", f"docker://{ref}"],
        check=True,
    )
    host = trivial_task(root / "host")
    image = with_from(host, ref, root)
    for task, backend in ((host, "local"), (image, "local"), (image, "docker")):  # pull, unpack, prepare: untimed
        await trial(task, backend)
    kinds: dict[str, list[float]] = {k: [] for k in ("spawn", "host", "image", "docker")}
    for _ in range(args.rounds):
        kinds["spawn"].append(measure_spawn(20))
        kinds["host"].append(await trial(host, "local"))
        kinds["image"].append(await trial(image, "local"))
        kinds["docker"].append(await trial(image, "docker"))
    result = {kind: statistics.median(samples) for kind, samples in kinds.items()}
    result["step_host"] = await step(host, args.steps)
    result["step_image"] = await step(image, args.steps)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="termgym-bench-images-", dir="/tmp") as scratch:
        root = Path(scratch)
        os.chmod(root, 0o755)
        os.environ["TERMGYM_ENV_CACHE_DIR"] = str(root / "cache")
        (root / "host").mkdir()
        with running_registry(_mkdir(root / "registry")) as registry:
            try:
                ms = {k: v * 1000 for k, v in asyncio.run(_measured(args, root, registry)).items()}
            finally:
                subprocess.run(["rm", "-rf", str(root / "cache")], check=False)
    print(f"embedded backend on a task image, {args.rounds} rounds, medians, {os.cpu_count()} cores\n")
    print("| measure (median) | ms | ratio | target |")
    print("|---|---|---|---|")
    print(f"| fresh `bwrap ... true` spawn | {ms['spawn']:.2f} | 1 | |")
    print(
        f'| `env.step("true")`, host\'s system | {ms["step_host"]:.3f} | {ms["step_host"] / ms["spawn"]:.3f} of the spawn | |'
    )
    print(
        f'| `env.step("true")`, pulled image | {ms["step_image"]:.3f} | {ms["step_image"] / ms["spawn"]:.3f} of the spawn'
        " | at most 0.25 |"
    )
    print(f"| trivial trial, host's system | {ms['host']:.1f} | 1 | |")
    print(
        f"| trivial trial, pulled image | {ms['image']:.1f} | {ms['image'] / ms['host']:.2f}x the host's | at most 1.5x |"
    )
    print(f"| trivial trial, Docker, same image | {ms['docker']:.1f} | {ms['docker'] / ms['host']:.2f}x the host's | |")


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


async def _measured(args: argparse.Namespace, root: Path, registry: str) -> dict[str, float]:
    try:
        return await measure(args, root, registry)
    finally:
        await close_backends()


if __name__ == "__main__":
    main()
