"""The torch sampler with its key/value cache against the same sampler recomputing every position,
side by side on the same episodes. One run, one table.

Episodes are shaped like the main job's (``--preset tiny``'s policy size, a chat prompt, turns of
sampled tokens, an observation between turns) but need no sandbox: each of ``--episodes``
concurrent episodes samples ``--turns`` turns of ``--tokens`` tokens at temperature 1 from its own
seeded generator, with ``--observation`` fixed tokens appended after each turn. Both samplers see
the same requests in the same rounds, so they must sample the same ids; the table gives the wall
time of each and their ratio, and the positions each computed.

    .venv/bin/python bench/kv_cache.py [--episodes 8] [--turns 3] [--tokens 30] [--observation 40]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from rich.table import Table

from termgym.trainer.config import PRESETS
from termgym.trainer.models import build_tiny_policy, load_policy
from termgym.trainer.sampler import BatchedSampler


async def run_episodes(sampler: BatchedSampler, args, vocab: int) -> list[list[int]]:
    async def one(index: int) -> list[int]:
        rng, generator = random.Random(index), torch.Generator().manual_seed(index)
        ids = [rng.randrange(4, vocab) for _ in range(args.prompt)]
        for _ in range(args.turns):
            for _ in range(args.tokens):
                token, _ = await sampler.sample(ids, generator)
                ids = [*ids, token]
            ids = ids + [rng.randrange(4, vocab) for _ in range(args.observation)]
        sampler.forget(ids)
        return ids

    return list(await asyncio.gather(*(one(i) for i in range(args.episodes))))


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=8, help="concurrent episodes (the preset's concurrency)")
    parser.add_argument("--prompt", type=int, default=80, help="prompt tokens")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=30, help="sampled tokens per turn")
    parser.add_argument("--observation", type=int, default=40, help="observation tokens after each turn")
    parser.add_argument("--repeats", type=int, default=3, help="alternating timed runs of each sampler")
    args = parser.parse_args()
    tiny = PRESETS["tiny"]
    with tempfile.TemporaryDirectory() as scratch:
        policy, _ = load_policy(
            build_tiny_policy(
                Path(scratch), seed=0, hidden=tiny["hidden"], layers=tiny["layers"], experts=tiny["experts"]
            )
        )
    vocab = policy.config.vocab_size
    samplers = {
        "recompute every position": lambda: BatchedSampler(policy, kv_cache=False),
        "key/value cache": lambda: BatchedSampler(policy),
    }
    seconds: dict[str, list[float]] = {name: [] for name in samplers}
    outputs, computed = {}, {}
    for _ in range(args.repeats):  # alternate, so machine noise falls on both
        for name, make in samplers.items():
            sampler = make()
            began = time.perf_counter()
            outputs[name] = asyncio.run(run_episodes(sampler, args, vocab))
            seconds[name].append(time.perf_counter() - began)
            computed[name] = sampler.cache.computed if sampler.cache is not None else None
    plain, cached = (outputs[name] for name in samplers)
    if plain != cached:
        print("the two samplers sampled different ids", file=sys.stderr)
        return 1
    base = min(seconds["recompute every position"])
    table = Table(
        title=f"torch sampler · {args.episodes} episodes x {args.turns} turns x {args.tokens} tokens · "
        f"best of {args.repeats}",
        title_justify="left",
    )
    for column in ("sampler", "seconds", "time / recompute", "positions computed"):
        table.add_column(column, justify="left" if column == "sampler" else "right")
    for name in samplers:
        best = min(seconds[name])
        table.add_row(
            name,
            f"{best:.2f}",
            f"{best / base:.2f}",
            "all, every round" if computed[name] is None else str(computed[name]),
        )
    Console(width=140).print(table)
    print("identical sampled ids: yes")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
