"""Dense per-assertion reward against binary reward, where the two can differ (issue 44), and the
warm critic against a cold one, on the ``parts`` family set (``envs/families/parts.py``: 3 to 5
independent parts a task, one assertion each, the scripted teacher mistaken on each part
independently).

Per seed, one supervised start as the main job makes it (the shipped tiny base, the teacher's
demonstrations, mistakes included, on the pool's tasks but the ones kept for PPO), checkpointed
once; then from that one start, on the same PPO tasks with the same budget:

- ``dense``: PPO on the verifier's per-assertion reward (its critic warmed up first);
- ``binary``: the same with reward 1 if resolved, else 0;
- ``cold-critic`` (``--critic``): one policy update with no critic warm-up, for the critic's
  explained variance at the first policy update, against ``dense``'s (warmed up).

Each arm's policy and the start are evaluated greedily on the seed's held-out set (names never
trained on). Per seed and pooled over the seeds it prints the held-out resolved rate (Wilson 95%
interval over the tasks) and the share of assertions passed (bootstrap 95% interval over the
tasks), the tasks the dense arm resolves that the binary one does not and the reverse (sign test),
and what each arm's batches gave PPO to learn from: the share of the policy updates whose batch
held no resolved episode (where a binary reward is zero for every episode, and its advantages are
the critic's error alone), the mean resolved share of a batch, and the spread of the rewards.

    .venv/bin/python bench/dense_binary.py [--seeds 0 1 2] [--out runs/dense-binary] [--critic] [--table-only] [--jobs 3]

The seeds run at once, each in a process of its own (``--jobs``; its output in ``OUT/seedS.log``).
A seed whose directory (``OUT/seedS``) holds a ``result.json`` is not run again; ``--table-only``
prints the table of the seeds there. ``--quick``: every size shrunk, for a smoke test.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console

from termgym.cli import run_command
from termgym.envs.families import generate_split
from termgym.records import TrialRecord
from termgym.tasks import Task, load_task
from termgym.trainer.config import PRESETS, Config
from termgym.trainer.demonstrations import record_demonstrations, teacher_held_out
from termgym.trainer.evaluate import EvalSummary, paired_change
from termgym.trainer.held_out import held_out
from termgym.trainer.models import load_policy, policy_renderer
from termgym.trainer.pipeline import Pool, build_policy, kept_for_ppo, reinforce, warm_start
from termgym.trainer.sft import Demonstration

# The main job's preset on the parts set, made to fit: a smaller pool and held-out set, fewer
# supervised steps and policy updates; turns enough for five parts and the submitting reply.
SETTING: dict = dict(
    families="parts",
    pool=384,
    ppo_pool=96,
    heldout=80,
    start_floor=0.0,
    sft_steps=120,
    critic_warmup_steps=2,
    steps=10,  # 2 critic warm-up steps, then 8 policy updates
    max_turns=7,
    max_context=640,
)
QUICK: dict = dict(pool=12, ppo_pool=4, heldout=6, sft_steps=4, steps=3, batch_size=4, minibatch_size=4, concurrency=4)
ARMS = ("dense", "binary")
Z95 = 1.959963984540054


def bench_config(seed: int, quick: bool = False) -> Config:
    """The ``tiny`` preset with ``SETTING`` (and ``QUICK`` with ``quick``), for ``seed``."""
    return Config(**{**PRESETS["tiny"], **SETTING, **(QUICK if quick else {}), "seed": seed})


# -- intervals (pure) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Estimate:
    """A share and its 95% interval."""

    value: float
    low: float
    high: float

    def __str__(self) -> str:
        return f"{self.value:.1%} [{self.low:.1%}, {self.high:.1%}]"

    def apart_from(self, other: Estimate) -> bool:
        return self.low > other.high or other.low > self.high


def wilson(successes: int, n: int, z: float = Z95) -> Estimate:
    """The share ``successes / n`` with its Wilson score interval."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return Estimate(p, max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_mean(values: list[float], draws: int = 2000, seed: int = 0) -> Estimate:
    """The mean of ``values`` with the 2.5th and 97.5th percentiles of the means of ``draws``
    resamples (with replacement, a fixed generator: the same values give the same interval)."""
    if not values:
        raise ValueError("no values to resample")
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(draws))
    return Estimate(sum(values) / n, means[int(0.025 * draws)], means[min(draws - 1, int(0.975 * draws))])


# -- one seed --------------------------------------------------------------------------------------


def eval_records(run: Path, label: str) -> list[TrialRecord]:
    path = run / "eval" / f"{label}.jsonl"
    return [TrialRecord(**json.loads(line)) for line in path.read_text().splitlines()]


def per_task(records: list[TrialRecord]) -> dict[str, tuple[bool, float]]:
    """Each held-out task's outcome: resolved, and the share of its assertions passed."""
    return {r.task: (r.resolved, r.passed / r.total if r.total else 0.0) for r in records}


PART_KINDS = {"write": "holds exactly", "nest": "is a directory", "copy": "has the content of"}


def part_kinds(records: list[TrialRecord]) -> dict[str, list[int]]:
    """Pure: per kind of part (``envs/families/parts.py``), its assertions passed and in all, over
    ``records`` (a part's kind read from its assertion's description)."""
    counts = {kind: [0, 0] for kind in PART_KINDS}
    for record in records:
        for assertion in record.assertions:
            kind = next(k for k, says in PART_KINDS.items() if says in assertion["name"])
            counts[kind][0] += bool(assertion["passed"])
            counts[kind][1] += 1
    return counts


def signal(metrics: list[dict]) -> dict:
    """What an arm's batches gave PPO to learn from (pure): over its policy updates, the share whose
    batch held no resolved episode (a binary reward zero everywhere: its advantages are the
    critic's error alone) and the share whose own reward did not vary at all; the resolved share
    of the first batch (the start's, sampled) and of each update's; the critic's explained variance
    at the first policy update."""
    updates = [m for m in metrics if not m["warmup"]]
    resolved = [m["resolved"] for m in updates]
    n = len(updates)
    return {
        "updates": n,
        "no_resolved_share": sum(r == 0 for r in resolved) / n if n else math.nan,
        "flat_share": sum(m["reward_std"] < 1e-12 for m in updates) / n if n else math.nan,
        "first_resolved": metrics[0]["resolved"] if metrics else math.nan,
        "resolved_mean": statistics.mean(resolved) if n else math.nan,
        "passed_mean": statistics.mean(m["passed"] for m in updates) if n else math.nan,
        # none where the first update's batch had one reward throughout (its returns do not vary)
        "first_ev": updates[0]["explained_variance"] if n and updates[0]["reward_std"] >= 1e-12 else None,
        "resolved_by_update": resolved,
    }


def arm_signals(run: Path) -> dict[str, dict]:
    """``signal`` of every arm run in ``run`` (its ``metrics.jsonl``), in the bench's order."""
    signals = {}
    for arm in (*ARMS, "cold-critic"):
        path = run / arm / "metrics.jsonl"
        if path.exists():
            signals[arm] = signal([json.loads(line) for line in path.read_text().splitlines()])
    return signals


def finished_eval(run: Path, label: str, tasks: int) -> bool:
    """Whether ``run/eval/LABEL.jsonl`` holds a record for each of ``tasks`` tasks (a run resumed)."""
    path = run / "eval" / f"{label}.jsonl"
    return path.exists() and len(path.read_text().splitlines()) == tasks


def finished_metrics(out: Path, steps: int) -> list[dict] | None:
    """An arm's metrics, when it finished all its steps (a run resumed), else None."""
    path = out / "metrics.jsonl"
    metrics = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return metrics if len(metrics) == steps and (out / "policy").exists() else None


def reuse_demonstration(line: str) -> Demonstration:
    """One line of ``demonstrations.jsonl`` (JSON lists back to tuples)."""
    fields = json.loads(line)
    return Demonstration(**{**fields, "commands": tuple(fields["commands"])})


def generated_pool(run: Path, cfg: Config) -> Pool:
    """The seed's training pool and held-out set in ``run/tasks`` (written once, read back when
    there). Not audited: every task of the parts set is accepted (tests/envs: the oracle resolves
    each family, doing nothing passes nothing, each part's command earns its own assertion), as the
    main job's validation split is not audited either."""

    def split(name: str, count: int) -> list[Task]:
        root = run / "tasks" / name
        paths = (
            sorted(p for p in root.iterdir() if p.is_dir())
            if (root / "split.json").exists()
            else generate_split(root, name, count, cfg.seed, family_set=cfg.families)
        )
        return [load_task(p) for p in paths]

    train = split("train", cfg.pool)
    return Pool(train, split("heldout", cfg.heldout), train, [])


async def one_seed(root: Path, cfg: Config, console: Console, critic: bool, teacher: bool) -> dict:
    """The seed's supervised start, both arms from it (and the cold critic's first update with
    ``critic``), each evaluated on the held-out set; writes and returns ``OUT/seedS/result.json``.
    What an interrupted run of the seed finished (the start, an arm, an evaluation) is kept."""
    run = root / f"seed{cfg.seed}"
    run.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    began = time.monotonic()
    pool = generated_pool(run, cfg)
    supervised, reinforced = kept_for_ppo(pool.selection, cfg.ppo_pool)
    start = run / "sft" / "policy"
    if (start / "config.json").exists():
        policy, tokenizer = load_policy(start)
        demos = (run / "sft" / "demonstrations.jsonl").read_text().splitlines()
    else:
        shutil.rmtree(run / "init", ignore_errors=True)
        policy, tokenizer = build_policy(run, cfg, console)
        renderer = policy_renderer(run / "init", tokenizer, cfg)
        recorded = run / "sft" / "demonstrations.jsonl"  # written once every demonstration is recorded
        if recorded.exists():
            demos = [reuse_demonstration(line) for line in recorded.read_text().splitlines()]
        else:
            shutil.rmtree(run / "sft", ignore_errors=True)
            demos = await record_demonstrations(run, cfg, supervised, renderer, console)
        await warm_start(run, cfg, demos, policy, tokenizer, console)
    renderer = policy_renderer(start, tokenizer, cfg)
    seconds["supervised"] = time.monotonic() - began

    async def evaluation(label: str, model) -> None:
        began = time.monotonic()
        if not finished_eval(run, label, len(pool.heldout)):
            (run / "eval" / f"{label}.jsonl").unlink(missing_ok=True)
            if model is None:
                await teacher_held_out(run, cfg, renderer, pool.heldout, console)
            else:
                await held_out(run, cfg, label, model, renderer, pool.heldout, console)
        seconds["evaluation"] = seconds.get("evaluation", 0.0) + time.monotonic() - began

    await evaluation("sft", policy)
    if teacher:
        await evaluation("teacher", None)
    arms: dict[str, dict] = {}
    plans = [(arm, replace(cfg, reward=arm)) for arm in ARMS]
    if critic:
        plans.append(("cold-critic", replace(cfg, critic_warmup_steps=0, steps=1)))
    for arm, arm_cfg in plans:
        began = time.monotonic()
        metrics = finished_metrics(run / arm, arm_cfg.steps)
        if metrics is None:
            shutil.rmtree(run / arm, ignore_errors=True)
            console.print(f"[bold]seed {cfg.seed} · {arm}[/]: {arm_cfg.steps} steps from the supervised start")
            metrics = await reinforce(arm_cfg, start, reinforced, run / arm)
        seconds[arm] = time.monotonic() - began
        arms[arm] = signal(metrics)
        if arm in ARMS:
            await evaluation(arm, load_policy(run / arm / "policy")[0])
    labels = ("sft", *ARMS, *(("teacher",) if teacher else ()))
    result = {
        "seed": cfg.seed,
        "pool": len(pool.train),
        "demonstrations": len(demos),
        "ppo_tasks": len(reinforced),
        "heldout": {label: per_task(eval_records(run, label)) for label in labels},
        "arms": arms,
        "seconds": seconds,
    }
    (run / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


# -- the table (pure) ------------------------------------------------------------------------------


def resolved_of(outcomes: dict[str, list]) -> Estimate:
    return wilson(sum(bool(v[0]) for v in outcomes.values()), len(outcomes))


def passed_of(outcomes: dict[str, list]) -> Estimate:
    return bootstrap_mean([float(v[1]) for v in outcomes.values()])


def as_summary(outcomes: dict[str, list]) -> EvalSummary:
    """Enough of an ``EvalSummary`` for ``paired_change`` (the tasks' resolved rates)."""
    rates = {task: float(bool(v[0])) for task, v in outcomes.items()}
    return EvalSummary(len(rates), 0.0, 0.0, 0.0, 0, task_rates=rates)


def pooled(results: list[dict], label: str) -> dict[str, list]:
    """One label's outcomes over every seed (task names prefixed with the seed)."""
    return {f"{r['seed']}/{task}": v for r in results for task, v in r["heldout"][label].items()}


def table(results: list[dict]) -> str:
    """The Markdown tables: held-out figures per seed and pooled, the batches' signal, and the
    critic's explained variance when measured."""
    if not results:
        raise ValueError("no seed to tabulate")
    rows = [*((str(r["seed"]), r["heldout"]) for r in results)]
    if len(results) > 1:
        labels = results[0]["heldout"].keys()
        rows.append(("pooled", {label: pooled(results, label) for label in labels}))
    teacher = all("teacher" in r["heldout"] for r in results)
    lines = [
        "| seed | tasks | held-out resolved: start | dense | binary | dense - binary | apart | dense / binary only (sign test) | assertions passed: start | dense | binary |"
        + (" teacher resolved |" if teacher else ""),
        "|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if teacher else ""),
    ]
    for name, held in rows:
        dense, binary = resolved_of(held["dense"]), resolved_of(held["binary"])
        change = paired_change(as_summary(held["binary"]), as_summary(held["dense"]))
        lines.append(
            f"| {name} | {len(held['sft'])} | {resolved_of(held['sft'])} | **{dense}** | **{binary}** "
            f"| {dense.value - binary.value:+.1%} | {'yes' if dense.apart_from(binary) else 'no'} "
            f"| {change.gained} / {change.lost} (p = {change.p_value:.2g}) "
            f"| {passed_of(held['sft'])} | {passed_of(held['dense'])} | {passed_of(held['binary'])} |"
            + (f" {resolved_of(held['teacher'])} |" if teacher else "")
        )
    lines += [
        "",
        "| seed | arm | policy updates | batches with no resolved episode | batches whose reward did not vary | resolved share: start (sampled) | resolved share of a batch, mean over updates | assertions passed per episode, mean over updates | explained variance at the first policy update |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for arm, s in r["arms"].items():
            ev = s["first_ev"]
            lines.append(
                f"| {r['seed']} | {arm} | {s['updates']} | {s['no_resolved_share']:.0%} | {s['flat_share']:.0%} "
                f"| {s['first_resolved']:.1%} | {s['resolved_mean']:.1%} | {s['passed_mean']:.2f} "
                f"| {'n/a' if ev is None or not math.isfinite(ev) else f'{ev:.2f}'} |"
            )
    with_kinds = [r for r in results if "kinds" in r]
    if with_kinds:
        lines += [
            "",
            "| seed | policy | " + " | ".join(f"{kind} parts passed" for kind in PART_KINDS) + " |",
            "|---|---|" + "---|" * len(PART_KINDS),
        ]
        for r in with_kinds:
            for label, counts in r["kinds"].items():
                cells = " | ".join(f"{p / n:.1%} ({p}/{n})" if n else "-" for p, n in counts.values())
                lines.append(f"| {r['seed']} | {label} | {cells} |")
    critic = [r for r in results if "cold-critic" in r["arms"]]
    if critic:
        warm, cold = (
            [math.nan if ev is None else ev for ev in (r["arms"][arm]["first_ev"] for r in critic)]
            for arm in ("dense", "cold-critic")
        )
        lines += [
            "",
            f"Explained variance at the first policy update (dense reward), warm critic against cold, seeds "
            f"{', '.join(str(r['seed']) for r in critic)}: warm {', '.join(f'{v:.2f}' for v in warm)} (mean "
            f"{statistics.mean(warm):.2f}); cold {', '.join(f'{v:.2f}' for v in cold)} (mean {statistics.mean(cold):.2f}).",
        ]
    return "\n".join(lines)


def child_command(args, seed: int) -> list[str]:
    """This bench for one seed, as ``--jobs`` runs it in a process of its own."""
    flags = [
        flag for flag, on in (("--critic", args.critic), ("--teacher", args.teacher), ("--quick", args.quick)) if on
    ]
    return [sys.executable, str(Path(__file__).resolve()), "--seeds", str(seed), "--out", args.out, *flags]


async def run_seeds_apart(args, seeds: list[int]) -> int:
    """Run ``seeds`` as processes of their own, ``args.jobs`` at a time, each one's output in
    ``OUT/seedS.log``; 0 when every one finished. Each seed's figures are the same as in one process
    (a seed's runs are deterministic and share nothing); ``OMP_WAIT_POLICY=PASSIVE`` keeps torch's
    threads from spinning while the processes share the cores (it changes no figure)."""
    limit = asyncio.Semaphore(args.jobs)
    Path(args.out).mkdir(parents=True, exist_ok=True)

    async def one(seed: int) -> int:
        async with limit:
            began = time.monotonic()
            with open(Path(args.out) / f"seed{seed}.log", "wb") as log:
                process = await asyncio.create_subprocess_exec(
                    *child_command(args, seed),
                    stdout=log,
                    stderr=log,
                    env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
                )
                code = await process.wait()
            print(f"seed {seed}: {time.monotonic() - began:.0f}s, exit {code} ({log.name})", file=sys.stderr)
            return code

    codes = await asyncio.gather(*(one(seed) for seed in seeds))
    return max(codes, default=0)


async def main_async(args) -> int:
    console = Console(file=sys.stderr, width=None if sys.stderr.isatty() else 140)
    root = Path(args.out)
    pending = [seed for seed in args.seeds if not (root / f"seed{seed}" / "result.json").exists()]
    if args.jobs > 1 and len(pending) > 1 and not args.table_only:
        began = time.monotonic()
        if await run_seeds_apart(args, pending):
            print(f"a seed failed: see {root}/seedS.log", file=sys.stderr)
            return 1
        print(f"seeds {' '.join(map(str, pending))}: {time.monotonic() - began:.0f}s in all", file=sys.stderr)
    results = []
    for seed in args.seeds:
        done = root / f"seed{seed}" / "result.json"
        if not done.exists():
            if args.table_only:
                print(f"seed {seed}: no finished run in {done.parent} (no result.json)", file=sys.stderr)
                return 2
            began = time.monotonic()
            await one_seed(root, bench_config(seed, args.quick), console, args.critic, args.teacher)
            print(f"seed {seed}: {time.monotonic() - began:.0f}s", file=sys.stderr)
        result = json.loads(done.read_text())
        evaluated = [label for label in result["heldout"] if (done.parent / "eval" / f"{label}.jsonl").exists()]
        kinds = {label: part_kinds(eval_records(done.parent, label)) for label in evaluated}
        results.append(
            {**result, "arms": arm_signals(done.parent) or result["arms"], **({"kinds": kinds} if kinds else {})}
        )
    print(table(results))
    return 0


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="runs/dense-binary", help="each seed's run goes to OUT/seedS")
    parser.add_argument("--critic", action="store_true", help="also the cold critic's first policy update")
    parser.add_argument("--teacher", action="store_true", help="also the scripted teacher on the held-out set")
    parser.add_argument("--table-only", action="store_true", help="tabulate the seeds there; run nothing")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke test")
    parser.add_argument(
        "--jobs", type=int, default=3, help="seeds run at once, each in a process of its own (1: one after the other)"
    )
    args = parser.parse_args()
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    return run_command(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
