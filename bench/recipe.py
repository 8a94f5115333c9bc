"""The published recipe's comparisons at small scale, each in the conditions its mechanism needs to
show, over several seeds, at the same budget, on the same audited pool and held-out set. One run,
one table (mean ± standard deviation over seeds), one PNG per comparison.

Everything trains on the long family set (``--preset tiny-long``: 4 to 8 turns, 8 to 20 assertions
a task; ``bench/long_start.py`` measures how little of it the supervised start resolves in full).
Per seed: a tiny MoE policy and its supervised warm start (the short family set's demonstrations
first, then a few steps on the long pool's, as the preset says), shared by every arm of that seed; one
critic warm-up over a share of the pool (``--warmup-epochs``, in rollouts of the start), shared by
every arm that has a warm critic (its checkpoint is copied, and the arm continues from it); then
PPO arms of ``--steps`` policy updates:

1. dense per-assertion reward against binary reward (each arm's critic warmed up on its own
   reward): held-out resolved rate and share of assertions passed, and the held-out tasks each arm
   gained and lost against its supervised start, summed over the seeds (exact sign test);
2. the warm critic against a cold one (no warm-up): explained variance at the first policy update
   and over the first three, and the training reward over the policy updates;
3. R3: not an arm here: ``bench/r3_sweep.py`` sweeps the conditions in which the sampler's experts
   differ from the trainer's (its table is in the docs next to this one);
4. straggler bias: ``cancel`` against ``carry-over`` and ``reweight`` (over-sampling 560/512), each
   with every trial of a step running at once, as in the published run (at the preset's 8 at a
   time, the trials still running when the batch fills are the last launched, whatever their
   length): the longest family's launched share against its kept share (weighted, for reweight),
   and its held-out resolved rate after training;
5. PPO with the critic against a group-relative baseline without a critic (``--advantage group``,
   4 episodes per task, leave-one-out mean as the baseline): the same measures as in 1.

The recipe arm (dense, warm critic, reweight) serves comparisons 1, 2 and 5; comparison 4 runs it
again with every trial at once (``reweight``).

    .venv/bin/python bench/recipe.py [--seeds 0 1 2] [--only N ...] [--out runs/recipe-TIME] [--resume] [--quick]

``--quick`` shrinks everything (for a smoke test, and CI); the docs' table comes from the defaults.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console
from rich.table import Table

from termgym.agents.renderers import make_renderer
from termgym.cli import run_command
from termgym.records import TrialRecord
from termgym.scheduling.bias import launch_count
from termgym.tasks import load_task
from termgym.trainer.config import PRESETS, Config
from termgym.trainer.demonstrations import record_demonstrations
from termgym.trainer.evaluate import EvalSummary, paired_change, sign_test, summarise_records
from termgym.trainer.held_out import held_out, validation_share_reached
from termgym.trainer.models import TINY_FAMILY, load_policy, policy_renderer, tiny_tokenizer
from termgym.trainer.pipeline import (
    Pool,
    build_policy,
    first_demonstrations,
    prepare_pool,
    reinforce,
    warm_start,
)
from termgym.trainer.sft import Demonstration


@dataclass(frozen=True)
class Arm:
    """One PPO run from a seed's supervised start: its config from the recipe's, the warm-up it
    continues from (None: a cold critic, or none), and whether the held-out set is evaluated."""

    name: str
    adapt: Callable[[Config], Config]
    warmup: str | None
    evaluate: bool


def all_at_once(cfg: Config) -> Config:
    """``cfg`` with every trial a step launches running at once (concurrency = trials launched)."""
    return replace(cfg, concurrency=cfg.launch or launch_count(cfg.batch_size))


ARMS = {
    arm.name: arm
    for arm in (
        Arm("dense", lambda c: c, "warmup-dense", True),
        Arm("binary", lambda c: replace(c, reward="binary"), "warmup-binary", True),
        Arm("cold-critic", lambda c: replace(c, critic_warmup_steps=0), None, False),
        Arm("reweight", lambda c: all_at_once(replace(c, mode="reweight")), "warmup-dense", True),
        Arm("cancel", lambda c: all_at_once(replace(c, mode="cancel")), "warmup-dense", True),
        Arm("carry-over", lambda c: all_at_once(replace(c, mode="carry-over")), "warmup-dense", True),
        Arm("group", lambda c: replace(c, advantage="group", group_size=4, critic_warmup_steps=0), None, True),
    )
}
COMPARISONS: dict[int, tuple[str, tuple[str, ...]]] = {
    1: ("dense vs binary reward", ("dense", "binary")),
    2: ("warm vs cold critic", ("dense", "cold-critic")),
    4: ("straggler bias, every trial at once: reweight, cancel, carry-over", ("reweight", "cancel", "carry-over")),
    5: ("critic (GAE) vs group baseline", ("dense", "group")),
}


async def reuse_pool(pool_dir: Path) -> Pool:
    """The pool, held-out set and selection an earlier run of this benchmark wrote (``--resume``)."""
    train = [load_task(p) for p in sorted((pool_dir / "tasks" / "train").iterdir()) if p.is_dir()]
    heldout = [load_task(p) for p in sorted((pool_dir / "tasks" / "heldout").iterdir()) if p.is_dir()]
    validation = [load_task(p) for p in sorted((pool_dir / "tasks" / "validation").iterdir()) if p.is_dir()]
    selection = [load_task(Path(line)) for line in (pool_dir / "selection.txt").read_text().split()]
    return Pool(train, heldout, selection, [], validation)


def reuse_demonstration(line: str) -> Demonstration:
    """One line of the ``demonstrations.jsonl`` an earlier run wrote (JSON lists back to tuples)."""
    fields: dict[str, Any] = json.loads(line)
    return Demonstration(**{**fields, "commands": tuple(fields["commands"])})


def bench_config(quick: bool, steps: int) -> Config:
    """The ``tiny-long`` preset (its audited pool, held-out set and supervised start), with PPO arms
    of ``steps`` policy updates; ``quick``: every size shrunk for a smoke test."""
    cfg = replace(Config(**PRESETS["tiny-long"]), steps=steps)
    if quick:
        cfg = replace(
            cfg,
            pool=8,
            heldout=5,
            audit_cache="",
            sft_steps=4,
            sft_first_pool=8,
            sft_first_steps=4,
            sft_validation=4,
            sft_check_every=2,
            steps=2,
            batch_size=4,
            minibatch_size=4,
            hidden=64,
            layers=2,
            experts=4,
            concurrency=4,
        )
    return cfg


def warmup_steps_for(selection: int, batch_size: int, epochs: float) -> int:
    """Critic warm-up steps for ``epochs`` passes over a pool of ``selection`` tasks, at least 1."""
    return max(1, math.ceil(epochs * selection / batch_size))


def longest_family_shares(metrics: list[dict]) -> tuple[str, float, float, float]:
    """From the last step's cumulative accounting: the family whose launched trials ran longest,
    its launched share, kept share and importance-weighted kept share."""
    groups = metrics[-1]["scheduler"]["run"]["families"]["groups"]
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
    """A run's metrics already on disk with all its steps (``--resume``), or None."""
    path = out / "metrics.jsonl"
    metrics = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return metrics if len(metrics) == steps and (out / "policy").exists() else None


def arms_for(only: list[int]) -> list[str]:
    """The arms the chosen comparisons need, in ``ARMS`` order."""
    wanted = {arm for n in only for arm in COMPARISONS[n][1]}
    return [name for name in ARMS if name in wanted]


async def one_seed(
    root: Path,
    cfg: Config,
    pool: Pool,
    demos: tuple[list[Demonstration], list[Demonstration]],
    arms: list[str],
    console: Console,
    resume: bool,
) -> dict:
    """The warm start of one seed, its critic warm-ups and every arm in ``arms`` from it; returns
    the arms' figures. With ``resume``, whatever is already complete on disk is reused."""
    run = root / f"seed{cfg.seed}"
    start = run / "sft" / "policy"
    n = len(pool.heldout)
    if resume and (start / "config.json").exists():
        policy, tokenizer = load_policy(start)
    else:
        shutil.rmtree(run, ignore_errors=True)
        run.mkdir(parents=True)
        policy, tokenizer = build_policy(run, cfg, console)
        first, pool_demos = demos
        renderer = policy_renderer(run / "init", tokenizer, cfg)
        stop = validation_share_reached(run, cfg, policy, renderer, pool.validation, console)
        await warm_start(run, cfg, pool_demos, policy, tokenizer, console, first, stop)
    renderer = policy_renderer(start, tokenizer, cfg)
    sft = finished_eval(run, "sft", n) if resume else None
    steps_taken = len(json.loads((run / "sft" / "losses.json").read_text()))
    out: dict = {
        "sft": {
            "heldout": sft
            or (await held_out(run, cfg, "sft", policy, renderer, pool.heldout, console)).greedy.to_dict(),
            "long_steps": steps_taken - cfg.sft_first_steps,
        }
    }
    warm = cfg.critic_warmup_steps
    warmed: set[str] = set()  # the warm-ups this seed has, run once and copied into each arm

    async def warmup(name: str, arm_cfg: Config) -> Path:
        """The critic warm-up alone (``warm`` critic-only steps), checkpointed in ``run/name``."""
        where = run / name
        if name not in warmed and not (resume and finished_metrics(where, warm)):
            shutil.rmtree(where, ignore_errors=True)
            console.print(f"[bold]seed {cfg.seed} · {name}[/]: {warm} steps, {warm * cfg.batch_size} rollouts")
            await reinforce(replace(arm_cfg, steps=warm), start, pool.selection, where)
        warmed.add(name)
        return where

    for name in arms:
        arm = ARMS[name]
        arm_cfg = arm.adapt(cfg)
        total = arm_cfg.steps + (warm if arm.warmup else 0)
        console.print(f"[bold]seed {cfg.seed} · {name}[/]")
        began = time.monotonic()
        where = run / name
        metrics = finished_metrics(where, total) if resume else None
        if metrics is None:
            shutil.rmtree(where, ignore_errors=True)
            (run / "eval" / f"{name}.jsonl").unlink(missing_ok=True)
            if arm.warmup is not None:
                base = await warmup(arm.warmup, arm.adapt(cfg))
                shutil.copytree(base, where)
                await reinforce(replace(arm_cfg, steps=total, resume=True), start, pool.selection, where)
            else:
                await reinforce(arm_cfg, start, pool.selection, where)
            metrics = [json.loads(line) for line in (where / "metrics.jsonl").read_text().splitlines()]
        out[name] = {"metrics": metrics, "seconds": time.monotonic() - began, "warmup": warm if arm.warmup else 0}
        if arm.evaluate:
            done = finished_eval(run, name, n) if resume else None
            if done is None:
                (run / "eval" / f"{name}.jsonl").unlink(missing_ok=True)
                trained, _ = load_policy(where / "policy")
                done = (await held_out(run, cfg, name, trained, renderer, pool.heldout, console)).greedy.to_dict()
            out[name]["heldout"] = done
    return out


# -- the table -------------------------------------------------------------------------------------


def policy_updates(result: dict, arm: str) -> list[dict]:
    return [m for m in result[arm]["metrics"] if not m["warmup"]]


def figures(results: list[dict], only: list[int]) -> list[tuple[str, str, str, str, str]]:
    """(comparison, measure, recipe arm, arm B, arm C) rows, each cell mean ± sd over seeds."""

    def having(*arms: str) -> list[dict]:
        return [r for r in results if all(arm in r for arm in arms)]

    def policy_ev(arm: str, count: int) -> list[float]:
        values = []
        for r in having(arm):
            updates = [m["explained_variance"] for m in policy_updates(r, arm)][:count]
            finite = [v for v in updates if v is not None and math.isfinite(v)]  # NaN: no return variance that step
            if finite:
                values.append(statistics.mean(finite))
        return values

    def train_reward(arm: str) -> list[float]:
        return [statistics.mean(m["reward"] for m in policy_updates(r, arm)) for r in having(arm)]

    def held(arm: str, key: str) -> list[float]:
        return [r[arm]["heldout"][key] for r in having(arm)]

    def family_rate(arm: str, family: str) -> list[float]:
        return [r[arm]["heldout"]["families"].get(family, {}).get("resolved", math.nan) for r in having(arm)]

    def flips(arm: str) -> str:
        """Held-out tasks the arm resolves and its supervised start does not, and the reverse,
        summed over the seeds, with the sign test on the total."""
        changes = [
            paired_change(EvalSummary(**r["sft"]["heldout"]), EvalSummary(**r[arm]["heldout"]))
            for r in having("sft", arm)
        ]
        gained, lost = sum(c.gained for c in changes), sum(c.lost for c in changes)
        return f"{gained} / {lost} (p = {sign_test(gained, lost):.3f})"

    long_steps = [float(r["sft"]["long_steps"]) for r in results]
    rows = [("supervised start", "steps on the long pool, to the validation share", mean_sd(long_steps, ".0f"), "", "")]
    rows.append(("", "held-out resolved", mean_sd(held("sft", "resolved")), "", ""))
    rows.append(("", "held-out share of assertions", mean_sd(held("sft", "passed_share")), "", ""))
    for n in only:
        title, arms = COMPARISONS[n]
        label = f"{n}. {title}"
        if n in (1, 5):
            other = arms[1]
            rows += [
                (label, "held-out resolved", mean_sd(held("dense", "resolved")), mean_sd(held(other, "resolved")), ""),
                (
                    "",
                    "held-out share of assertions",
                    mean_sd(held("dense", "passed_share")),
                    mean_sd(held(other, "passed_share")),
                    "",
                ),
                ("", "tasks gained / lost against the start, all seeds", flips("dense"), flips(other), ""),
            ]
        elif n == 2:
            rows += [
                (
                    label,
                    "EV at the first policy update",
                    mean_sd(policy_ev("dense", 1)),
                    mean_sd(policy_ev("cold-critic", 1)),
                    "",
                ),
                (
                    "",
                    "EV, mean of the first 3 updates",
                    mean_sd(policy_ev("dense", 3)),
                    mean_sd(policy_ev("cold-critic", 3)),
                    "",
                ),
                (
                    "",
                    "training reward over the policy updates",
                    mean_sd(train_reward("dense")),
                    mean_sd(train_reward("cold-critic")),
                    "",
                ),
            ]
        elif n == 4:
            seeds = having(*arms)
            shares = {arm: [longest_family_shares(policy_updates(r, arm)) for r in seeds] for arm in arms}
            longest = shares["cancel"][0][0] if seeds else "-"
            rows += [
                (
                    f"{label} ({len(seeds)} seeds)",
                    f"{longest}: launched share",
                    *(mean_sd([s[1] for s in shares[arm]]) for arm in arms),
                ),
                (
                    "",
                    f"{longest}: kept share (reweight: weighted)",
                    mean_sd([s[3] for s in shares["reweight"]]),
                    *(mean_sd([s[2] for s in shares[arm]]) for arm in arms[1:]),
                ),
                ("", f"{longest}: held-out resolved", *(mean_sd(family_rate(arm, longest)) for arm in arms)),
            ]
    return rows


# -- the plots -------------------------------------------------------------------------------------


def step_series(results: list[dict], arm: str, read: Callable[[dict], float | None]) -> list[list[float]]:
    """Per seed, ``read`` of each policy update of ``arm`` (NaN where it has no finite value)."""
    series = []
    for r in results:
        if arm in r:
            values = [read(m) for m in policy_updates(r, arm)]
            series.append([float(v) if isinstance(v, (int, float)) and math.isfinite(v) else math.nan for v in values])
    return series


def kept_share_of(family: str, weighted: bool) -> Callable[[dict], float | None]:
    def read(m: dict) -> float | None:
        groups = (m.get("scheduler") or {}).get("families", {}).get("groups", {})
        g = groups.get(family)
        return None if g is None else g["weighted_share" if weighted else "kept_share"]

    return read


def write_comparison_plots(root: Path, results: list[dict], only: list[int]) -> list[Path]:
    """``root/comparison-N.png``: per arm, the mean over seeds of a per-update measure, with the
    band of one standard deviation across seeds."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    written = []
    for n in only:
        title, arms = COMPARISONS[n]
        if n == 2:
            measure, label = (lambda m: m.get("explained_variance")), "critic explained variance"
            reads = {arm: measure for arm in arms}
        elif n == 4:
            runs = [r for r in results if "cancel" in r]
            if not runs:
                continue
            longest = longest_family_shares(policy_updates(runs[0], "cancel"))[0]
            label = f"{longest}: kept share of the step (reweight: weighted)"
            reads = {arm: kept_share_of(longest, weighted=arm == "reweight") for arm in arms}
        else:
            label = "training reward (mean per update)"
            reads = {arm: (lambda m: m.get("reward")) for arm in arms}
        figure, axes = plt.subplots(figsize=(6.5, 3.8), dpi=100)
        for arm in arms:
            series = step_series(results, arm, reads[arm])
            if not series:
                continue
            length = min(len(s) for s in series)
            steps = list(range(1, length + 1))
            columns = [[s[i] for s in series if math.isfinite(s[i])] for i in range(length)]
            means = [statistics.mean(c) if c else math.nan for c in columns]
            sds = [statistics.stdev(c) if len(c) > 1 else 0.0 for c in columns]
            shown = "recipe (dense, warm critic, reweight)" if arm == "dense" else arm
            axes.plot(steps, means, marker="o", linewidth=1.5, label=f"{shown} ({len(series)} seeds)")
            axes.fill_between(
                steps, [m - s for m, s in zip(means, sds)], [m + s for m, s in zip(means, sds)], alpha=0.2
            )
        axes.set(title=f"{n}. {title}", xlabel="policy update", ylabel=label)
        axes.grid(alpha=0.3)
        axes.legend(loc="best", fontsize=8)
        figure.tight_layout()
        path = root / f"comparison-{n}.png"
        figure.savefig(path)
        plt.close(figure)
        written.append(path)
    return written


async def main_async(args) -> int:
    console = Console(file=sys.stderr, width=None if sys.stderr.isatty() else 140)
    cfg = replace(bench_config(args.quick, args.steps), seed=args.seeds[0])
    root = Path(args.out or time.strftime("runs/recipe-%Y%m%d-%H%M%S", time.gmtime()))
    if root.exists() and any(root.iterdir()) and not args.resume:
        raise ValueError(f"{root} already holds a run; choose another --out, or --resume it")
    began = time.monotonic()
    recorded = [
        root / "pool" / "first" / "sft" / "demonstrations.jsonl",
        root / "pool" / "sft" / "demonstrations.jsonl",
    ]
    if args.resume and all(path.exists() for path in recorded):
        pool = await reuse_pool(root / "pool")
        first, pool_demos = ([reuse_demonstration(line) for line in path.read_text().splitlines()] for path in recorded)
    else:
        shutil.rmtree(root / "pool", ignore_errors=True)
        # one pool, held-out set and first family set's demonstrations for every seed
        shared = replace(cfg, seed=0)
        pool = await prepare_pool(root / "pool", shared, console)
        renderer = make_renderer(TINY_FAMILY, tiny_tokenizer())  # every seed's tokenizer is this one
        first = await first_demonstrations(root / "pool", shared, renderer, console)
        pool_demos = await record_demonstrations(root / "pool", shared, pool.selection, renderer, console)
    warm = warmup_steps_for(len(pool.selection), cfg.batch_size, args.warmup_epochs)
    cfg = replace(cfg, critic_warmup_steps=warm)
    arms = arms_for(args.only)
    results = [
        await one_seed(root, replace(cfg, seed=seed), pool, (first, pool_demos), arms, console, args.resume)
        for seed in args.seeds
    ]
    rows = figures(results, args.only)
    table = Table(
        title=f"recipe at small scale · long families · seeds {' '.join(map(str, args.seeds))} · mean ± sd over seeds"
        f" · {cfg.steps} policy updates of {cfg.batch_size} after {warm} warm-up steps ({warm * cfg.batch_size}"
        f" rollouts) · {len(pool.heldout)} held-out tasks",
        title_justify="left",
    )
    for column in ("comparison", "measure", "A (recipe)", "B", "C"):
        table.add_column(column, justify="left" if column in ("comparison", "measure") else "right")
    for row in rows:
        table.add_row(*row)
    Console(width=180).print(table)
    plots = write_comparison_plots(root, results, args.only)
    (root / "recipe.json").write_text(
        json.dumps(
            {
                "rows": rows,
                "seeds": args.seeds,
                "only": args.only,
                "warmup_steps": warm,
                "seconds": time.monotonic() - began,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"{time.monotonic() - began:.0f}s · run directory {root} · plots: {' '.join(p.name for p in plots)}")
    return 0


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--only",
        type=int,
        nargs="+",
        choices=sorted(COMPARISONS),
        default=sorted(COMPARISONS),
        metavar="N",
        help=f"run only these comparisons ({', '.join(map(str, COMPARISONS))}; 3 is bench/r3_sweep.py)",
    )
    parser.add_argument("--steps", type=int, default=6, help="policy updates per arm (default 6)")
    parser.add_argument(
        "--warmup-epochs",
        type=float,
        default=0.25,
        help="critic warm-up, in passes over the accepted pool (default 0.25: 5 steps of 32 for 600 tasks)",
    )
    parser.add_argument("--out", default=None)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="reuse the pool, warm starts, warm-ups, arms and evaluations already complete in --out",
    )
    args = parser.parse_args()
    if args.steps < 1 or args.warmup_epochs <= 0:
        parser.error("--steps must be at least 1 and --warmup-epochs above 0")
    return run_command(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
