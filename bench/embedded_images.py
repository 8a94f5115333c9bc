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
  prepared environment warm) over the host's system, over the pulled image, on Docker over the
  same image, and on Podman (``--backend docker`` at Podman's API, a service of the bench's own
  started by ``scripts/podman-service.sh``; ``--no-podman`` leaves it out); target for the image
  at most 1.5x the host's system.

    .venv/bin/python bench/embedded_images.py [--rounds 15] [--steps 200] [--no-podman]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.embedded_trial import trivial_task
from bench.step_latency import measure_spawn, timed
from termgym.agents.basic import ScriptedAgent
from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.images import build as images
from termgym.images.build import BASE_IMAGE
from termgym.sandboxes import close_backends
from termgym.sandboxes.docker import engine, wait_for_removals
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


class Engines:
    """The Docker backend's client pointed at the Docker engine or at Podman, one trial at a time
    (its client and its cache of built images are the process's: swapped whole)."""

    def __init__(self, podman_host: str | None) -> None:
        self.podman_host = podman_host
        self.saved: dict[str, tuple] = {}

    @contextlib.contextmanager
    def at(self, name: str) -> Iterator[None]:
        host = self.podman_host if name == "podman" else None
        previous = os.environ.get("DOCKER_HOST")
        client, ready = self.saved.get(name, (None, {}))
        if host is not None:
            os.environ["DOCKER_HOST"] = host
        engine._client, images._ready = client, ready
        try:
            yield
        finally:
            wait_for_removals(timeout=60)
            self.saved[name] = (engine._client, images._ready)
            if previous is None:
                os.environ.pop("DOCKER_HOST", None)
            else:
                os.environ["DOCKER_HOST"] = previous
            engine._client, images._ready = None, {}


@contextlib.contextmanager
def podman_service(root: Path, image: str) -> Iterator[str]:
    """A Podman API service of the bench's own (socket and storage under ``root``) holding
    ``image`` (the base image, tagged so); yields its ``DOCKER_HOST``. Stopped and removed after."""
    socket, storage = root / "podman.sock", root / "storage"
    env = {**os.environ, "TERMGYM_PODMAN_SOCKET": str(socket), "TERMGYM_PODMAN_STORAGE": str(storage)}
    repo = Path(__file__).resolve().parents[1]
    started = subprocess.run(["bash", "scripts/podman-service.sh"], cwd=repo, env=env, capture_output=True, text=True)
    if started.returncode != 0:
        log = (root / "podman.log").read_text()[-800:] if (root / "podman.log").exists() else ""
        raise SystemExit(f"Podman's service did not start: {started.stderr.strip()[-300:]}\n{log}")
    service = int((root / "podman.pid").read_text())
    try:
        podman = ["podman", "--root", str(storage / "root"), "--runroot", str(storage / "run")]
        subprocess.run([*podman, "tag", BASE_IMAGE, image], check=True, capture_output=True)
        yield f"unix://{socket}"
    finally:
        os.kill(service, signal.SIGTERM)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{service}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        for line in subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True).stdout.splitlines():
            pid, _, args = line.strip().partition(" ")
            if str(storage) in args:  # the conmons Podman keeps for minutes after each exec
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if str(root) in line]
        for mount in sorted(mounts, key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], check=False)
        subprocess.run(["rm", "-rf", str(root)], check=False)


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


async def measure(args: argparse.Namespace, root: Path, registry: str, engines: Engines) -> dict[str, float]:
    ref = f"{registry}/bench/base:1"
    host = trivial_task(root / "host")
    image = with_from(host, ref, root)
    for task, backend in ((host, "local"), (image, "local")):  # pull, unpack, prepare: untimed
        await trial(task, backend)
    names = ["docker", *(["podman"] if engines.podman_host else [])]
    for name in names:
        with engines.at(name):
            await trial(image, "docker")  # pulled (Docker) or tagged (Podman), built: untimed
    kinds: dict[str, list[float]] = {k: [] for k in ("spawn", "host", "image", *names)}
    for _ in range(args.rounds):
        kinds["spawn"].append(measure_spawn(20))
        kinds["host"].append(await trial(host, "local"))
        kinds["image"].append(await trial(image, "local"))
        for name in names:
            with engines.at(name):
                kinds[name].append(await trial(image, "docker"))
    result = {kind: statistics.median(samples) for kind, samples in kinds.items()}
    result["step_host"] = await step(host, args.steps)
    result["step_image"] = await step(image, args.steps)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--no-podman", action="store_true", help="leave Podman out")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="termgym-bench-images-", dir="/tmp") as scratch:
        root = Path(scratch)
        os.chmod(root, 0o755)
        os.environ["TERMGYM_ENV_CACHE_DIR"] = str(root / "cache")
        (root / "host").mkdir()
        with running_registry(_mkdir(root / "registry")) as registry, contextlib.ExitStack() as stack:
            ref = f"{registry}/bench/base:1"
            copy = ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", f"docker-daemon:{BASE_IMAGE}"]
            subprocess.run([*copy, f"docker://{ref}"], check=True)
            short = Path(tempfile.mkdtemp(prefix="tg-pm-", dir="/tmp"))  # Podman refuses a runroot over 50 characters
            podman = None if args.no_podman else stack.enter_context(podman_service(short, ref))
            try:
                ms = {k: v * 1000 for k, v in asyncio.run(_measured(args, root, registry, Engines(podman))).items()}
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
    if "podman" in ms:
        print(
            f"| trivial trial, Podman, same image | {ms['podman']:.1f} | {ms['podman'] / ms['host']:.2f}x the host's | |"
        )


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


async def _measured(args: argparse.Namespace, root: Path, registry: str, engines: Engines) -> dict[str, float]:
    try:
        return await measure(args, root, registry, engines)
    finally:
        await close_backends()


if __name__ == "__main__":
    main()
