"""The main job's evaluations (phases 5 and 7, ``trainer/pipeline.py``): a policy greedy, and
sampled with ``--eval-samples``, on the held-out set; the supervised start on the validation split
(``--start-floor``, ``--sft-stop-share``); the final tables, before PPO against after."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from termgym.progress import progress_bar
from termgym.records import append_record
from termgym.tasks import Task

from .config import Config
from .evaluate import EvalSummary, evaluate
from .rollout import rollout_options, rollout_settings


@dataclass(frozen=True)
class HeldOut:
    """One policy's held-out results: greedy, and sampled when ``--eval-samples`` asks for it."""

    greedy: EvalSummary
    sampled: EvalSummary | None = None


def _sampled(before: HeldOut, after: HeldOut) -> tuple[EvalSummary, EvalSummary] | None:
    """Both policies' sampled results, when both have them."""
    if before.sampled is None or after.sampled is None:
        return None
    return before.sampled, after.sampled


def result_table(before: HeldOut, after: HeldOut, teacher: EvalSummary | None = None) -> Table:
    """The final table: held-out results of the supervised start against after PPO (and the
    scripted teacher's, when the demonstrations were its)."""
    sampled = _sampled(before, after)
    table = Table(title=f"held-out set ({before.greedy.tasks} tasks)", title_justify="left")
    for column in (
        "policy",
        "resolved (greedy)",
        "assertions passed (greedy, mean)",
        "reward (greedy, mean)",
        *([f"resolved (sampled, {sampled[0].samples} per task)"] if sampled else []),
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for i, (label, s) in enumerate((("supervised start", before), ("after PPO", after))):
        g = s.greedy
        table.add_row(
            label,
            f"{g.resolved:.1%}",
            f"{g.passed:.2f}",
            f"{g.reward:.3f}",
            *([f"{sampled[i].resolved:.1%}"] if sampled else []),
        )
    if teacher is not None:
        row = ["teacher (scripted)", f"{teacher.resolved:.1%}", f"{teacher.passed:.2f}", f"{teacher.reward:.3f}"]
        table.add_row(*row, *([""] if sampled else []))
    return table


def family_table(before: HeldOut, after: HeldOut, trained: set[str], teacher: EvalSummary | None = None) -> Table:
    sampled = _sampled(before, after)
    table = Table(title="held-out resolved rate per family", title_justify="left")
    for column in (
        "family",
        "tasks",
        "supervised start",
        "after PPO",
        *(("sampled: start", "sampled: after PPO") if sampled else ()),
        *(("teacher",) if teacher is not None else ()),
    ):
        table.add_column(column, justify="left" if column == "family" else "right")
    summaries = (before.greedy, after.greedy, *(sampled or ()), *((teacher,) if teacher is not None else ()))
    for family, b in before.greedy.families.items():
        name = family if family in trained else f"{family} (never trained on)"
        rates = [s.families.get(family, {"resolved": float("nan")})["resolved"] for s in summaries]
        table.add_row(name, str(int(b["tasks"])), *(f"{rate:.1%}" for rate in rates))
    return table


async def held_out(
    run: Path,
    cfg: Config,
    label: str,
    model,
    renderer,
    tasks: list[Task],
    console: Console,
    what: str = "the held-out set",
) -> HeldOut:
    """Greedy evaluation on the held-out set (one record per task in ``run/eval/LABEL.jsonl``),
    then ``cfg.eval_samples`` sampled episodes per task (``run/eval/LABEL-sampled.jsonl``), with
    the same draws whatever the label."""
    results = []
    for samples, name in [(0, label)] + ([(cfg.eval_samples, f"{label}-sampled")] if cfg.eval_samples else []):
        with progress_bar(console) as progress:
            bar = progress.add_task(f"evaluation on {what} ({name})", total=len(tasks) * max(samples, 1))

            def on_record(record, trajectory, name=name, bar=bar) -> None:
                append_record(run / "eval" / f"{name}.jsonl", record)
                progress.advance(bar)

            summary, _ = await evaluate(
                model,
                renderer,
                tasks,
                rollout_options(cfg, f"eval-{name}-{run.name}"),
                rollout_settings(cfg),
                concurrency=cfg.concurrency,
                samples=samples,
                seed=cfg.seed,
                on_record=on_record,
                batched=not cfg.deterministic,
            )
        console.print(
            f"  {name}: resolved {summary.resolved:.1%}, mean assertions passed {summary.passed:.2f}"
            f" (a share of {summary.passed_share:.1%})"
        )
        results.append(summary)
    return HeldOut(*results)


async def on_validation(run: Path, cfg: Config, label: str, policy, renderer, tasks: list[Task], console: Console):
    """``policy`` greedy on the validation split ``tasks`` (records in ``run/eval/LABEL.jsonl``)."""
    greedy = replace(cfg, eval_samples=0)
    return (await held_out(run, greedy, label, policy, renderer, tasks, console, "the validation split")).greedy


async def check_start(run: Path, cfg: Config, policy, renderer, tasks: list[Task], console: Console) -> dict:
    """The supervised start, greedy, on the validation split (records in
    ``run/eval/validation-start.jsonl``) against ``cfg.start_floor``: the share of its assertions
    passed, the floor, and whether the start is within its band; a start below it is said in one
    line (the job goes on: what PPO does from there is still measured, but it is not the claim)."""
    summary = await on_validation(run, cfg, "validation-start", policy, renderer, tasks, console)
    within = summary.passed_share >= cfg.start_floor
    if not within:
        console.print(
            f"[bold yellow]the supervised start fell short of its band[/]: {summary.passed_share:.1%} of the validation"
            f" split's assertions, below --start-floor {cfg.start_floor:.0%};"
            " PPO's gain from it is not the main job's claim"
        )
    return {
        "passed_share": summary.passed_share,
        "resolved": summary.resolved,
        "floor": cfg.start_floor,
        "within": within,
    }


def validation_share_reached(
    run: Path, cfg: Config, policy, renderer, tasks: list[Task], console: Console
) -> Callable[[int], Awaitable[bool]]:
    """``warm_start``'s ``stop``: a greedy evaluation of ``policy`` on ``tasks`` (the validation
    split; records in ``run/eval/validation-STEPS.jsonl``), true once it passes at least
    ``cfg.sft_stop_share`` of their assertions on average."""

    async def reached(steps: int) -> bool:
        summary = await on_validation(run, cfg, f"validation-{steps}", policy, renderer, tasks, console)
        return summary.passed_share >= cfg.sft_stop_share

    return reached
