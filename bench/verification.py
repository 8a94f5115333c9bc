"""What the traced verification costs, measured side by side in one run.

Each round runs, interleaved, on the embedded backend and on Docker, two tasks done honestly: the
trivial task of the tests (two assertions, the assertion kit) and a real-pytest task whose verifier
runs the venv the image installed (``tests.redteam.toolchain``). Three variants of each: *untraced*
(the tracer taken away, ``exec_traced`` answering None, which only this benchmark does: the check
then counts every change outside ``/app`` as loaded, and these agents made none), *traced*
(termgym's default: since the agent changed nothing outside ``/app``, nothing a trace could find,
the verifier's own run goes untraced; only the steps before the changes are known are traced), and
*traced + helper* (the agent also writes a file outside ``/app`` that the verifier never loads, so
every step is traced and the check must resolve what the kernel loaded for every program the
verifier executed). Printed: medians of the whole trial and of its verification phase, and the
verification against the untraced one of the same task.

    .venv/bin/python bench/verification.py [--rounds 10] [--backends local,docker]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from termgym.agents import ScriptedAgent
from termgym.episode.options import EnvOptions
from termgym.sandboxes.docker import DockerSandbox
from termgym.sandboxes.local import LocalSandbox
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import write_task
from tests.redteam.toolchain import python_image, write_toolchain_task

DONE = "echo done > /app/result.txt"
HELPER = {"local": "mkdir -p /opt/helper && echo x > /opt/helper/tool", "docker": "echo x > /usr/local/bin/tool"}
VARIANTS = ("untraced", "traced", "traced + helper")
TRACING = (LocalSandbox, DockerSandbox)  # the backends that trace here


async def _cannot_trace(self: object, command: object) -> None:
    return None


async def trial(task_dir: Path, backend: str, variant: str) -> tuple[float, float]:
    """(total seconds, verification seconds) of one resolved trial."""
    commands = [DONE, *([HELPER[backend]] if variant == "traced + helper" else [])]
    saved = [cls.exec_traced for cls in TRACING]
    try:
        if variant == "untraced":
            for cls in TRACING:
                cls.exec_traced = _cannot_trace  # type: ignore[method-assign]
        record = await run_trial(load_task(task_dir), ScriptedAgent(tuple(commands)), EnvOptions(backend=backend))
    finally:
        for cls, method in zip(TRACING, saved, strict=True):
            cls.exec_traced = method  # type: ignore[method-assign]
    if not record.resolved:
        raise SystemExit(f"{backend} {task_dir.name} {variant}: not resolved ({record.error})")
    return record.timings["total"], record.timings["verify"]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--backends", default="local,docker")
    args = parser.parse_args()
    backends = args.backends.split(",")
    if "docker" in backends:
        python_image()
    root = Path(tempfile.mkdtemp(prefix="termgym-bench-verify-"))
    tasks = {"trivial": write_task(root / "a"), "venv-pytest": write_toolchain_task(root / "b")}
    cases = [(backend, name, variant) for backend in backends for name in tasks for variant in VARIANTS]
    samples: dict[tuple[str, str, str], list[tuple[float, float]]] = {case: [] for case in cases}

    async def run() -> None:
        for case in cases:  # a warm-up of each: images built, caches filled
            await trial(tasks[case[1]], case[0], case[2])
        for _ in range(args.rounds):
            for case in cases:
                samples[case].append(await trial(tasks[case[1]], case[0], case[2]))

    asyncio.run(run())
    print(f"verification, medians of {args.rounds} interleaved rounds (ms); ratio: verify / untraced verify")
    print(f"{'backend':8} {'task':12} {'variant':16} {'trial':>7} {'verify':>7} {'ratio':>6}")
    for backend, name, variant in cases:
        trial_ms = statistics.median(t for t, _ in samples[(backend, name, variant)]) * 1e3
        verify_ms = statistics.median(v for _, v in samples[(backend, name, variant)]) * 1e3
        base = statistics.median(v for _, v in samples[(backend, name, "untraced")]) * 1e3
        print(f"{backend:8} {name:12} {variant:16} {trial_ms:7.0f} {verify_ms:7.0f} {verify_ms / base:6.2f}")


if __name__ == "__main__":
    main()
