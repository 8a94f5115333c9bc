"""Does PPO change the agent? PPO from a finished main-job run's supervised checkpoint, then the
supervised and the PPO policy evaluated on the same tasks, task by task.

    .venv/bin/python bench/ppo_effect.py RUN_DIR [--set routing_replay=false ...] [--out DIR]
        [--validation 96] [--samples 8]

``RUN_DIR`` is a directory ``termgym train --preset tiny`` (``make demo``) wrote: its
``sft/policy``, ``selection.txt`` and ``tasks/heldout``. PPO runs with the preset's settings (each
``--set FIELD=VALUE`` overrides one ``trainer.config.Config`` field, JSON-valued) on the run's
audited selection. Both policies are then evaluated on a validation set and on the held-out set,
greedily and with ``--samples`` episodes per task at temperature 1, and the paired change (tasks
gained, lost, exact sign test; sampled, a task gains when its resolved rate rises) is printed. The
validation set is the next ``--validation`` tasks of the run's training split (the same families
and name space, none of them in the pool: ``generate_split(..., first=pool)``), so settings can be
compared on it without looking at the held-out set. PPO is not deterministic (the scheduler keeps
the first trials to finish), so compare configurations over several runs.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from termgym.cli import run_command
from termgym.envs.families import generate_split
from termgym.tasks import load_task
from termgym.trainer.config import PRESETS, Config
from termgym.trainer.evaluate import evaluate, paired_change
from termgym.trainer.models import load_policy, policy_renderer
from termgym.trainer.pipeline import kept_for_ppo, reinforce
from termgym.trainer.rollout import rollout_options, rollout_settings


def overrides(pairs: list[str]) -> dict:
    """``FIELD=VALUE`` pairs as Config fields (VALUE is JSON, or a plain string)."""
    defaults = Config()
    known = {f.name for f in fields(Config)}
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or name not in known:
            raise ValueError(f"--set {pair!r}: expected FIELD=VALUE with a field of trainer.config.Config")
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            parsed = value
        default = getattr(defaults, name)
        if isinstance(default, float) and type(parsed) is int:
            parsed = float(parsed)
        if default is not None and type(parsed) is not type(default):
            raise ValueError(f"--set {pair!r}: {name} takes a {type(default).__name__}")
        out[name] = parsed
    return out


async def main_async(args) -> int:
    run = Path(args.run)
    if not (run / "sft" / "policy" / "config.json").exists() or not (run / "selection.txt").exists():
        raise ValueError(f"{run} is not a finished main-job run (no sft/policy or selection.txt)")
    cfg = replace(Config(**PRESETS["tiny"]), **overrides(args.set))
    out = Path(args.out or time.strftime("runs/ppo-effect-%Y%m%d-%H%M%S", time.gmtime()))
    if out.exists() and any(out.iterdir()):
        raise ValueError(f"{out} already holds a run; choose another --out")
    selection = [load_task(Path(line)) for line in (run / "selection.txt").read_text().split()]
    await reinforce(cfg, run / "sft" / "policy", kept_for_ppo(selection, cfg.ppo_pool)[1], out)
    split = json.loads((run / "tasks" / "train" / "split.json").read_text())
    family_set = split.get("family_set", "short")
    validation = generate_split(
        out / "validation", "train", args.validation, split["seed"], first=split["count"], family_set=family_set
    )
    sets = {
        f"validation ({len(validation)} tasks)": [load_task(p) for p in validation],
        "held-out set": [load_task(p) for p in sorted((run / "tasks" / "heldout").iterdir()) if p.is_dir()],
    }
    report = {"run": str(run), "out": str(out), "overrides": overrides(args.set)}
    policies = [load_policy(policy_dir) for policy_dir in (run / "sft" / "policy", out / "policy")]
    decodings = {"greedy": 0, f"sampled, {args.samples} per task": args.samples} if args.samples else {"greedy": 0}
    for (label, tasks), (decoding, samples) in itertools.product(sets.items(), decodings.items()):
        summaries = []
        for policy, tokenizer in policies:
            summary, _ = await evaluate(
                policy,
                policy_renderer(run / "sft" / "policy", tokenizer, cfg),
                tasks,
                rollout_options(cfg, f"effect-{out.name}"),
                rollout_settings(cfg),
                concurrency=cfg.concurrency,
                samples=samples,
                seed=cfg.seed,
                batched=not cfg.deterministic,
            )
            summaries.append(summary)
        change = paired_change(*summaries)
        print(
            f"{label}, {decoding}: supervised {summaries[0].resolved:.1%} -> PPO {summaries[1].resolved:.1%}; "
            f"{change.describe(len(tasks))}"
        )
        families = {
            family: [s.families.get(family, {}).get("resolved") for s in summaries] for family in summaries[0].families
        }
        print(
            "  per family, supervised -> PPO: " + ", ".join(f"{f} {a:.0%} -> {b:.0%}" for f, (a, b) in families.items())
        )
        report[f"{label}, {decoding}"] = {
            "supervised": summaries[0].resolved,
            "ppo": summaries[1].resolved,
            "gained": change.gained,
            "lost": change.lost,
            "p_value": change.p_value,
            "families": families,
        }
    (out / "effect.json").write_text(json.dumps(report, indent=2) + "\n")
    return 0


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a finished termgym train --preset tiny run directory")
    parser.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE", help="override a Config field")
    parser.add_argument("--out", default=None)
    parser.add_argument("--validation", type=int, default=96, help="validation tasks (the training split's next ones)")
    parser.add_argument(
        "--samples",
        type=int,
        default=8,
        help="also evaluate this many episodes per task at temperature 1 (0: greedy only)",
    )
    args = parser.parse_args()

    return run_command(main_async(args))


if __name__ == "__main__":
    raise SystemExit(main())
