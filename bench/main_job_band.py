"""The main job's figure as a band over seeds: ``termgym train --preset tiny --seed S`` for each
seed, one after the other (never two at once: each takes the machine's cores), then one table of
the held-out results per seed (supervised start, after PPO, the scripted teacher, tasks gained and
lost with the sign test's p, wall time) and their mean, min and max, and how many seeds PPO took
past the teacher. Seed 0 is what a fresh clone's ``make demo`` gives.

    .venv/bin/python bench/main_job_band.py [--seeds 0 1 2 3 4] [--out runs/band] [--table-only]

Each seed's run goes to ``OUT-S`` (``runs/band-0`` ...); a seed whose run directory already holds a
``summary.json`` is not run again, so an interrupted band continues where it stopped, and
``--table-only`` prints the table of the runs there without running anything. The job is
deterministic on one machine (``--deterministic``, the default), so a seed's row is a property of
the code and the machine, not of the moment; on this 2-core machine one seed takes 7 to 15
minutes (a seed other than 0, 1 and 2 audits its pool first: about 3 minutes more).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@dataclass(frozen=True)
class SeedResult:
    """One seed's held-out figures (shares of the held-out tasks resolved, greedy)."""

    seed: int
    start: float
    ppo: float
    teacher: float
    gained: int
    lost: int
    p_value: float
    tasks: int
    seconds: float | None  # the job's wall time, when this bench ran it

    @property
    def beats_teacher(self) -> bool:
        return self.ppo > self.teacher


def seed_result(seed: int, summary: dict, seconds: float | None = None) -> SeedResult:
    """Pure: a seed's row from its run's ``summary.json``."""
    heldout = summary["heldout"]
    change = heldout["change"]
    return SeedResult(
        seed=seed,
        start=heldout["sft"]["resolved"],
        ppo=heldout["ppo"]["resolved"],
        teacher=heldout["teacher"]["resolved"],
        gained=change["gained"],
        lost=change["lost"],
        p_value=change["p_value"],
        tasks=heldout["sft"]["tasks"],
        seconds=seconds,
    )


def table(results: list[SeedResult]) -> str:
    """Pure: the band as a Markdown table (a row per seed, then mean, min and max) and a line on
    the teacher."""
    if not results:
        raise ValueError("no seed to tabulate")
    lines = [
        "| seed | supervised start | after PPO | teacher (scripted) | gained / lost (sign test) | wall time |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        wall = f"{r.seconds / 60:.1f} min" if r.seconds is not None else ""
        lines.append(
            f"| {r.seed} | {r.start:.1%} | **{r.ppo:.1%}** | {r.teacher:.1%} | {r.gained} / {r.lost} (p = {r.p_value:.0e}) | {wall} |"
        )
    for name, pick in (("mean", lambda v: sum(v) / len(v)), ("min", min), ("max", max)):

        def of(attribute: str, pick=pick):
            return pick([getattr(r, attribute) for r in results])

        counts = f"{of('gained'):.1f} / {of('lost'):.1f}" if name == "mean" else f"{of('gained')} / {of('lost')}"
        lines.append(f"| {name} | {of('start'):.1%} | {of('ppo'):.1%} | {of('teacher'):.1%} | {counts} | |")
    beat = [r.seed for r in results if r.beats_teacher]
    behind = [r.seed for r in results if not r.beats_teacher]
    verdict = (
        f"PPO beat the teacher on every seed ({len(results)} of {len(results)})."
        if not behind
        else f"PPO beat the teacher on {len(beat)} of {len(results)} seeds; not on seed{'s' if len(behind) > 1 else ''} "
        + ", ".join(map(str, behind))
        + "."
    )
    return "\n".join(lines) + f"\n\n{verdict} Held-out set: {results[0].tasks} tasks, greedy."


def run_seed(seed: int, out: Path) -> float:
    """Run the main job for ``seed`` into ``out``; returns its wall seconds."""
    command = [sys.executable, "-m", "termgym.trainer", "--preset", "tiny", "--seed", str(seed), "--out", str(out)]
    print(f"seed {seed}: {' '.join(command[1:])}", file=sys.stderr, flush=True)
    began = time.monotonic()
    done = subprocess.run(command, check=False)
    if done.returncode != 0:
        raise SystemExit(f"seed {seed}: the job failed (exit {done.returncode}); see {out}")
    return time.monotonic() - began


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="The main job's held-out figures over seeds, as one table.")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--out", default="runs/band", help="each seed's run goes to OUT-SEED")
    parser.add_argument("--table-only", action="store_true", help="tabulate the runs there; run nothing")
    args = parser.parse_args(argv)
    results = []
    for seed in args.seeds:
        out = Path(f"{args.out}-{seed}")
        summary, seconds = out / "summary.json", None
        if not summary.exists():
            if args.table_only:
                print(f"seed {seed}: no finished run in {out} (no summary.json)", file=sys.stderr)
                return 2
            if out.exists() and any(out.iterdir()):
                print(f"seed {seed}: {out} holds an unfinished run; remove it to run the seed again", file=sys.stderr)
                return 2
            seconds = run_seed(seed, out)
        results.append(seed_result(seed, json.loads(summary.read_text()), seconds))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
