"""How a supervised start does on the long family set's own training pool: the condition the
recipe's dense-against-binary comparison needs (``bench/recipe.py``, issue 21) is a start that
resolves at most 15% of the training pool in full while passing at least 30% of its assertions on
average, so that one bit per trajectory carries little and the assertions carry much.

The ``tiny-long`` preset's start: ``--first-steps`` supervised steps on the short family set's
reference trajectories (its own audited pool), then steps on the long pool's, saved at each
``--checkpoints`` count of long steps (``--first-steps 0``: the long pool's alone). Each checkpoint
is evaluated greedily on the same ``--tasks`` tasks of the training pool, taken round-robin over
its families (never the held-out set, which nothing here is tuned on). One table: long steps,
resolved share, mean share of assertions passed, whether that meets the target, per family
resolved share.

    .venv/bin/python bench/long_start.py [--checkpoints 60 80 100 120 150 200] [--first-steps 450]
        [--tasks 100] [--seed 0] [--out DIR]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console

from termgym.agents.renderers import make_renderer
from termgym.cli import run_command
from termgym.tasks import Task
from termgym.trainer.config import PRESETS, Config
from termgym.trainer.demonstrations import record_demonstrations
from termgym.trainer.held_out import held_out
from termgym.trainer.models import TINY_FAMILY, tiny_tokenizer
from termgym.trainer.pipeline import build_policy, first_demonstrations, prepare_pool
from termgym.trainer.sft import supervised_train

TARGET_RESOLVED, TARGET_SHARE = 0.15, 0.30


def meets_target(resolved: float, share: float) -> bool:
    """The recipe's condition for comparing dense with binary reward."""
    return resolved <= TARGET_RESOLVED and share >= TARGET_SHARE


def balanced(tasks: list[Task], count: int) -> list[Task]:
    """The first ``count`` of ``tasks`` taken round-robin over their families (in order of first
    appearance), each family's tasks in their order."""
    by_family: dict[str, list[Task]] = {}
    for task in tasks:
        by_family.setdefault(task.family or "", []).append(task)
    queues = list(by_family.values())
    picked: list[Task] = []
    while len(picked) < min(count, len(tasks)):
        for queue in queues:
            if queue and len(picked) < count:
                picked.append(queue.pop(0))
    return picked


async def main_async(args: argparse.Namespace) -> int:
    console = Console(file=sys.stderr, width=None if sys.stderr.isatty() else 140)
    checkpoints = sorted(set(args.checkpoints))
    cfg = replace(
        Config(**PRESETS["tiny-long"]),
        seed=args.seed,
        sft_steps=checkpoints[-1],
        sft_first_steps=args.first_steps,
        sft_first_families="short" if args.first_steps else "",
    )
    run = Path(args.out or tempfile.mkdtemp(prefix="long-start-"))
    began = time.monotonic()
    shared = replace(cfg, seed=0)  # the recipe's pools, whatever the policy's seed (their verdicts are shipped)
    pool = await prepare_pool(run, shared, console)
    renderer = make_renderer(TINY_FAMILY, tiny_tokenizer())
    first = await first_demonstrations(run, shared, renderer, console)
    demos = await record_demonstrations(run, shared, pool.selection, renderer, console)
    policy, tokenizer = build_policy(run, cfg, console)
    pad_id = tokenizer.pad_token_id
    assert isinstance(pad_id, int)  # the tiny tokenizer has one
    sft_began = time.monotonic()
    first_losses = (
        supervised_train(
            policy,
            [(d.ids, d.mask) for d in first],
            steps=cfg.sft_first_steps,
            batch_size=cfg.sft_batch_size,
            lr=cfg.sft_lr,
            seed=cfg.seed,
            pad_id=pad_id,
        )
        if first
        else []
    )
    first_seconds = time.monotonic() - sft_began
    saved: dict[int, dict] = {}

    def keep(step: int, _loss: float) -> None:
        if step + 1 in checkpoints:
            saved[step + 1] = copy.deepcopy(policy.state_dict())

    sft_began = time.monotonic()
    losses = supervised_train(
        policy,
        [(d.ids, d.mask) for d in demos],
        steps=cfg.sft_steps,
        batch_size=cfg.sft_batch_size,
        lr=cfg.sft_lr,
        seed=cfg.seed,
        pad_id=pad_id,
        on_step=keep,
    )
    sft_seconds = time.monotonic() - sft_began
    sample = balanced(pool.selection, args.tasks)
    rows = []
    for steps in checkpoints:
        policy.load_state_dict(saved[steps])
        policy.eval()
        summary = (await held_out(run, cfg, f"start-{steps}", policy, renderer, sample, console)).greedy
        rows.append((steps, losses[steps - 1], summary))
    families = sorted({f for *_, s in rows for f in s.families})
    print(
        f"long family set, training pool of {len(pool.selection)} accepted tasks, {len(demos)} demonstrations,"
        f" seed {cfg.seed}; greedy on {len(sample)} of the pool, round-robin over its families"
    )
    if first:
        print(
            f"first: {cfg.sft_first_steps} steps on {len(first)} short-family demonstrations in {first_seconds:.0f}s,"
            f" loss {first_losses[0]:.3f} -> {first_losses[-1]:.3f}"
        )
    print(f"then: {cfg.sft_steps} long steps in {sft_seconds:.0f}s, loss {losses[0]:.3f} -> {losses[-1]:.3f}\n")
    print(
        "| long steps | loss | resolved | mean share of assertions | meets the target | " + " | ".join(families) + " |"
    )
    print("|---|---|---|---|---|" + "---|" * len(families))
    for steps, loss, s in rows:
        per_family = " | ".join(f"{s.families[f]['resolved']:.0%}" for f in families)
        verdict = "yes" if meets_target(s.resolved, s.passed_share) else "no"
        print(f"| {steps} | {loss:.3f} | {s.resolved:.1%} | {s.passed_share:.1%} | {verdict} | {per_family} |")
    mean_turns = statistics.mean(len(d.commands) for d in demos)
    print(f"\ntarget: resolved at most {TARGET_RESOLVED:.0%}, share at least {TARGET_SHARE:.0%};")
    print(f"reference turns per task {mean_turns:.1f}; {time.monotonic() - began:.0f}s in all · run directory {run}")
    return 0


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, nargs="+", default=[60, 80, 100, 120, 150, 200], metavar="STEPS")
    parser.add_argument(
        "--first-steps",
        type=int,
        default=PRESETS["tiny-long"]["sft_first_steps"],
        help="supervised steps on the short family set first (default: the preset's; 0: none)",
    )
    parser.add_argument("--tasks", type=int, default=100, help="training-pool tasks evaluated (default 100)")
    parser.add_argument("--seed", type=int, default=0, help="the policy's (the pools are the recipe's, seed 0)")
    parser.add_argument("--out", default=None, help="run directory (default: a fresh temporary one)")
    args = parser.parse_args()
    if min(args.checkpoints) < 1 or args.tasks < 1 or args.first_steps < 0:
        parser.error("--checkpoints and --tasks must be at least 1, --first-steps at least 0")
    return run_command(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
