"""What the content keys of an environment recipe cost (issue 42): one build context of ``--files``
files and ``--mb`` megabytes, every key computed ``--rounds`` times with the files in the page
cache (the case on every trial start but the first): ``context_digest`` alone, the embedded
warm pool's recipe, the embedded prepared environment's key and the Docker image tag's digest,
each with every file's bytes read (the digests ``file_sha256`` remembers forgotten before each
call) and with the digests of the settled files remembered (the files are left ``SETTLED_NS`` to
settle first: the case on every trial start but the first in one process); a walk that only
``lstat``\\ s every entry (what a metadata key would cost) for comparison.

    .venv/bin/python bench/context_key.py [--files 2000] [--mb 50] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from termgym.images import build  # noqa: E402
from termgym.images.context import SETTLED_NS, context_digest, forget_file_digests  # noqa: E402
from termgym.sandboxes.local.env_cache import environment_key  # noqa: E402
from termgym.sandboxes.local.pool import files_digest  # noqa: E402


def make_context(root: Path, files: int, total_bytes: int) -> None:
    size = total_bytes // files
    (root / "Dockerfile").write_text("FROM debian:bookworm-slim\nCOPY . /app\n")
    for index in range(files):
        directory = root / f"d{index % 40:02d}"
        directory.mkdir(exist_ok=True)
        (directory / f"f{index:05d}.bin").write_bytes(os.urandom(size))


def lstat_walk(root: Path) -> None:
    for directory, dirs, names in os.walk(root):
        for name in dirs + names:
            os.lstat(os.path.join(directory, name))


def median_ms(fn: Callable[[], object], rounds: int) -> float:
    fn()  # the page cache warmed
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description="what the content keys of an environment recipe cost (issue 42)")
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--mb", type=float, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="termgym-context-key-") as scratch:
        context = Path(scratch)
        make_context(context, args.files, int(args.mb * (1 << 20)))
        dockerfile = context / "Dockerfile"
        time.sleep(SETTLED_NS / 1e9)  # every file's times settled: its digest may be remembered
        keys: dict[str, Callable[[], object]] = {
            "context_digest": lambda: context_digest(context),
            "embedded warm pool recipe (files_digest)": lambda: files_digest(context, dockerfile),
            "embedded prepared environment (environment_key)": lambda: environment_key(
                dockerfile.read_bytes(), context, {}, ["app"]
            ),
            "Docker image tag (build.context_digest)": lambda: build.context_digest(context, dockerfile.read_text()),
        }
        rows: dict[str, Callable[[], object]] = {"lstat walk only (no content)": lambda: lstat_walk(context)}
        for name, key in keys.items():
            rows[f"{name}, every byte read"] = lambda key=key: (forget_file_digests(), key())
            rows[f"{name}, settled files' digests remembered"] = key
        print(f"{args.files} files, {args.mb:g} MB, median of {args.rounds} rounds, page cache warm")
        print("| key | median ms |\n|---|---|")
        for name, fn in rows.items():
            print(f"| {name} | {median_ms(fn, args.rounds):.1f} |")


if __name__ == "__main__":
    main()
