"""The published recipe's comparisons at small scale, each over several seeds, at the same budget,
on the same audited pool and held-out set. One run, one table (mean ± standard deviation over seeds).

Per seed: a tiny MoE policy and its supervised warm start (shared by every arm of that seed), then
PPO arms from that start:

1. dense per-assertion reward (passed / 20) against binary reward (1 if resolved): held-out resolved
   rate and mean assertions passed after the same number of PPO steps, and the held-out tasks each
   arm gained and lost against its supervised start, summed over the seeds (exact sign test);
2. critic warm-up against a cold critic: explained variance at the first policy update and its mean
   over the first three policy updates;
3. R3 on against off, with a bfloat16 sampler against the float32 trainer: the mean train/inference
   log-prob gap over the loss region;
4. ``cancel`` against the bias-correcting ``reweight`` mode (both over-sampling 560/512): the kept
   share (weighted share for reweight) of the longest family against its launched share, and the
   mean step wall time (ratio);
5. PPO with the critic against a group-relative baseline without a critic (``--advantage group``,
   4 episodes per task, leave-one-out mean as the baseline): the same measures as in 1.

    .venv/bin/python bench/recipe.py [--seeds 0 1 2] [--out runs/recipe-TIME] [--quick]

``--quick`` shrinks everything (for a smoke test); the README's table comes from the defaults.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from rich.table import Table

from termgym.agents.renderers import make_renderer
from termgym.cli import run_command
from termgym.records import TrialRecord
from termgym.tasks import load_task
from termgym.trainer.config import PRESETS, Config
from termgym.trainer.evaluate import EvalSummary, paired_change, sign_test, summarise_records
from termgym.trainer.models import TINY_FAMILY, load_policy, policy_renderer, tiny_tokenizer
from termgym.trainer.pipeline import (
    Pool,
    build_policy,
    held_out,
    prepare_pool,
    record_demonstrations,
    reinforce,
    warm_start,
)
from termgym.trainer.sft import Demonstration


async def reuse_pool(pool_dir: Path) -> Pool:
    """The pool, held-out set and selection an earlier run of this benchmark wrote (``--resume``)."""
    train = [load_task(p) for p in sorted((pool_dir / "tasks" / "train").iterdir()) if p.is_dir()]
    heldout = [load_task(p) for p in sorted((pool_dir / "tasks" / "heldout").iterdir()) if p.is_dir()]
    selection = [load_task(Path(line)) for line in (pool_dir / "selection.txt").read_text().split()]
    return Pool(train, heldout, selection, [])


def reuse_demonstration(line: str) -> Demonstration:
    """One line of the ``demonstrations.jsonl`` an earlier run wrote (JSON lists back to tuples)."""
    fields: dict[str, Any] = json.loads(line)
    return Demonstration(**{**fields, "commands": tuple(fields["commands"])})


def bench_config(quick: bool) -> Config:
    """The tiny preset (its audited 2000-task pool, 192 held-out tasks and supervised start), with
    PPO arms of 8 steps instead of 16."""
    cfg = Config(**PRESETS["tiny"])
    cfg = replace(cfg, steps=8)
    if quick:
        cfg = replace(
            cfg,
            pool=12,
            heldout=6,
            sft_steps=10,
            steps=3,
            batch_size=4,
            minibatch_size=4,
            hidden=64,
            layers=2,
            experts=4,
            concurrency=4,
        )
    return cfg


def longest_family_shares(metrics: list[dict]) -> tuple[str, float, float, float]:
    """From the last step's cumulative accounting: the family whose launched trials ran longest,
    its launched share, kept share and importance-weighted kept share."""
    run = metrics[-1]["scheduler"]["run"]["families"]
    groups = run["groups"]
    longest = max(groups, key=lambda g: groups[g]["launched_seconds"] / max(groups[g]["launched"], 1))
    g = groups[longest]
    return longest, g["launched_share"], g["kept_share"], g["weighted_share"]


def mean_sd(values: list[float], fmt: str = ".3f") -> str:
    if not values:
        return "-"
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):{fmt}} ± {sd:{fmt}}"


def finished_eval(run: Path, label: str, tasks: int) -> dict | None:
    """A held-out evaluation already on disk (``--resume``), or None."""
    path = run / "eval" / f"{label}.jsonl"
    records = [TrialRecord(**json.loads(line)) for line in path.read_text().splitlines()] if path.exists() else []
    return summarise_records(records).to_dict() if len(records) == tasks else None


def finished_metrics(out: Path, steps: int) -> list[dict] | None:
    """An arm's metrics already on disk with all its steps (``--resume``), or None."""
    path = out / "metrics.jsonl"
    metrics = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return metrics if len(metrics) == steps and (out / "policy").exists() else None


async def one_seed(
    root: Path, cfg: Config, pool, demos, console: Console, resume: bool = False, skip: frozenset[str] = frozenset()
) -> dict:
    """The warm start of one seed and every arm from it; returns the arms' figures. With
    ``resume``, a warm start, an arm or an evaluation already complete on disk is reused."""
    run = root / f"seed{cfg.seed}"
    start = run / "sft" / "policy"
    n = len(pool.heldout)
    if resume and (start / "config.json").exists():
        policy, tokenizer = load_policy(start)
    else:
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        policy, tokenizer = build_policy(run, cfg, console)
        warm_start(run, cfg, demos, policy, tokenizer, console)
    renderer = policy_renderer(start, tokenizer, cfg)
    sft = finished_eval(run, "sft", n) if resume else None
    out: dict = {
        "sft": {
            "heldout": sft
            or (await held_out(run, cfg, "sft", policy, renderer, pool.heldout, console)).greedy.to_dict()
        }
    }

    async def arm(name: str, arm_cfg: Config, evaluate: bool) -> list[dict]:
        if f"{name}@{cfg.seed}" in skip:
            console.print(f"[bold]seed {cfg.seed} · {name}[/]: skipped (--skip)")
            return []
        console.print(f"[bold]seed {cfg.seed} · {name}[/]")
        began = time.monotonic()
        metrics = finished_metrics(run / name, arm_cfg.steps) if resume else None
        if metrics is None:
            shutil.rmtree(run / name, ignore_errors=True)
            (run / "eval" / f"{name}.jsonl").unlink(missing_ok=True)
            metrics = await reinforce(arm_cfg, start, pool.selection, run / name)
        out[name] = {"metrics": metrics, "seconds": time.monotonic() - began}
        if evaluate:
            done = finished_eval(run, name, n) if resume else None
            if done is None:
                (run / "eval" / f"{name}.jsonl").unlink(missing_ok=True)
                trained, _ = load_policy(run / name / "policy")
                done = (await held_out(run, cfg, name, trained, renderer, pool.heldout, console)).greedy.to_dict()
            out[name]["heldout"] = done
        return metrics

    await arm("dense", cfg, True)  # also: warm critic, R3 on (float32 sampler), reweight
    await arm("binary", replace(cfg, reward="binary"), True)
    await arm("cold-critic", replace(cfg, critic_warmup_steps=0, steps=3), False)
    await arm(
        "r3-on", replace(cfg, sampler_dtype="bfloat16", routing_replay=True, steps=3, critic_warmup_steps=0), False
    )
    await arm(
        "r3-off", replace(cfg, sampler_dtype="bfloat16", routing_replay=False, steps=3, critic_warmup_steps=0), False
    )
    await arm("cancel", replace(cfg, mode="cancel", steps=4, critic_warmup_steps=4), False)
    await arm("reweight", replace(cfg, mode="reweight", steps=4, critic_warmup_steps=4), False)
    await arm("group", replace(cfg, advantage="group", group_size=4), True)
    return out


def figures(results: list[dict], warmup: int) -> list[tuple[str, str, str, str]]:
    """(comparison, measure, arm A, arm B) rows, each cell mean ± sd over seeds."""

    def having(*arms: str) -> list[dict]:
        return [r for r in results if all(arm in r for arm in arms)]

    def policy_ev(arm: str, first: int, count: int) -> list[float]:
        values = []
        for r in having(arm):
            updates = [m["explained_variance"] for m in r[arm]["metrics"] if not m["warmup"]][first : first + count]
            finite = [v for v in updates if v is not None and math.isfinite(v)]  # NaN: no return variance that step
            if finite:
                values.append(statistics.mean(finite))
        return values

    def gap(arm: str) -> list[float]:
        return [statistics.mean(m["logprob_gap"] for m in r[arm]["metrics"]) for r in having(arm)]

    def held(arm: str, key: str) -> list[float]:
        return [r[arm]["heldout"][key] for r in having(arm)]

    def flips(arm: str) -> str:
        """Held-out tasks the arm resolves and its supervised start does not, and the reverse,
        summed over the seeds, with the sign test on the total."""
        changes = [
            paired_change(EvalSummary(**r["sft"]["heldout"]), EvalSummary(**r[arm]["heldout"]))
            for r in having("sft", arm)
        ]
        gained, lost = sum(c.gained for c in changes), sum(c.lost for c in changes)
        return f"{gained} / {lost} (p = {sign_test(gained, lost):.3f})"

    both = having("cancel", "reweight")  # a seed whose arm was skipped leaves this comparison
    shares = {arm: [longest_family_shares(r[arm]["metrics"]) for r in both] for arm in ("cancel", "reweight")}
    wall = {
        arm: [statistics.mean(m["scheduler"]["wall_seconds"] for m in r[arm]["metrics"]) for r in both]
        for arm in ("cancel", "reweight")
    }
    longest = shares["cancel"][0][0]
    return [
        ("supervised start", "held-out resolved", mean_sd(held("sft", "resolved")), ""),
        (
            "1. dense vs binary reward",
            "held-out resolved",
            mean_sd(held("dense", "resolved")),
            mean_sd(held("binary", "resolved")),
        ),
        ("", "held-out assertions passed", mean_sd(held("dense", "passed")), mean_sd(held("binary", "passed"))),
        ("", "tasks gained / lost against the start, all seeds", flips("dense"), flips("binary")),
        (
            "2. warm vs cold critic",
            "EV at the first policy update",
            mean_sd(policy_ev("dense", 0, 1)),
            mean_sd(policy_ev("cold-critic", 0, 1)),
        ),
        (
            "",
            "EV, mean of the first 3 updates",
            mean_sd(policy_ev("dense", 0, 3)),
            mean_sd(policy_ev("cold-critic", 0, 3)),
        ),
        (
            "3. R3 on vs off (bf16 sampler)",
            "mean |Δ log p| (loss region)",
            mean_sd(gap("r3-on"), ".2e"),
            mean_sd(gap("r3-off"), ".2e"),
        ),
        (
            f"4. reweight vs cancel ({len(both)} seeds)",
            f"{longest}: launched share",
            mean_sd([s[1] for s in shares["reweight"]]),
            mean_sd([s[1] for s in shares["cancel"]]),
        ),
        (
            "",
            f"{longest}: kept share (reweight: weighted)",
            mean_sd([s[3] for s in shares["reweight"]]),
            mean_sd([s[2] for s in shares["cancel"]]),
        ),
        (
            "",
            "step wall time, reweight / cancel",
            mean_sd([a / b for a, b in zip(wall["reweight"], wall["cancel"])]),
            "",
        ),
        (
            "5. critic (GAE) vs group baseline, no critic",
            "held-out resolved",
            mean_sd(held("dense", "resolved")),
            mean_sd(held("group", "resolved")),
        ),
        ("", "held-out assertions passed", mean_sd(held("dense", "passed")), mean_sd(held("group", "passed"))),
        ("", "tasks gained / lost against the start, all seeds", flips("dense"), flips("group")),
    ]


async def main_async(args) -> int:
    console = Console(file=sys.stderr, width=None if sys.stderr.isatty() else 140)
    cfg = replace(bench_config(args.quick), seed=args.seeds[0])
    root = Path(args.out or time.strftime("runs/recipe-%Y%m%d-%H%M%S", time.gmtime()))
    if root.exists() and any(root.iterdir()) and not args.resume:
        raise ValueError(f"{root} already holds a run; choose another --out, or --resume it")
    began = time.monotonic()
    if args.resume and (root / "pool" / "sft" / "demonstrations.jsonl").exists():
        pool = await reuse_pool(root / "pool")
        demos = [
            reuse_demonstration(line)
            for line in (root / "pool" / "sft" / "demonstrations.jsonl").read_text().splitlines()
        ]
    else:
        shutil.rmtree(root / "pool", ignore_errors=True)
        pool = await prepare_pool(
            root / "pool", replace(cfg, seed=0), console
        )  # one pool and held-out set for every seed
        renderer = make_renderer(TINY_FAMILY, tiny_tokenizer())  # every seed's tokenizer is this one
        demos = await record_demonstrations(root / "pool", cfg, pool.selection, renderer, console)
    results = [
        await one_seed(root, replace(cfg, seed=seed), pool, demos, console, args.resume, frozenset(args.skip))
        for seed in args.seeds
    ]
    rows = figures(results, cfg.critic_warmup_steps)
    table = Table(
        title=f"recipe at small scale · seeds {' '.join(map(str, args.seeds))} · mean ± sd over seeds "
        f"· {cfg.steps} PPO steps of {cfg.batch_size} · {len(pool.heldout)} held-out tasks",
        title_justify="left",
    )
    for column in ("comparison", "measure", "A (recipe)", "B"):
        table.add_column(column, justify="left" if column in ("comparison", "measure") else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=160).print(table)
    (root / "recipe.json").write_text(
        json.dumps({"rows": rows, "seeds": args.seeds, "seconds": time.monotonic() - began}, indent=2) + "\n"
    )
    print(f"{time.monotonic() - began:.0f}s · run directory {root}")
    return 0


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    parser.add_argument(
        "--skip",
        nargs="*",
        default=[],
        metavar="ARM@SEED",
        help="arms to leave out, e.g. reweight@1 (its comparison then uses the other seeds)",
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="reuse the pool, warm starts, arms and evaluations already complete in --out",
    )
    args = parser.parse_args()

    return run_command(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
