"""What the main job's supervised start imitates (phase 4a, ``trainer/pipeline.py``): demonstrations
recorded in fresh sandboxes (the reference solutions, or the scripted teacher's commands with its
mistakes), or the rows of ATIF trajectories given with ``--sft-data``; and the teacher on the
held-out set, the rate the policy's is measured against."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from termgym.atif import tokenizer_fingerprint
from termgym.envs.families import reference_commands
from termgym.envs.families.teacher import teacher_commands
from termgym.errors import ConfigError
from termgym.progress import progress_bar
from termgym.records import TrialRecord, append_record
from termgym.tasks import Task

from .config import DEFAULT_MAX_CONTEXT, Config
from .evaluate import EvalSummary, summarise_records
from .rollout import rollout_options, rollout_settings
from .sft import Demonstration, collect_demonstrations, save_demonstrations
from .sft_data import load_sft_data, write_report


def demonstrated_commands(cfg: Config) -> Callable[[Task], tuple[str, ...]]:
    """What a demonstration of a task types: its reference commands, or the scripted teacher's."""
    if cfg.demonstrations == "teacher":
        return lambda task: teacher_commands(task.path, cfg.seed).commands
    return lambda task: tuple(reference_commands(task.path))


async def record_demonstrations(
    run: Path, cfg: Config, selection: list[Task], renderer, console: Console
) -> list[Demonstration]:
    """Phase 4a: the demonstrations of ``selection`` (the reference's, resolved ones only, or the
    scripted teacher's, every one), recorded in fresh sandboxes; ``run/sft/demonstrations.jsonl``
    and every trial's record in ``run/sft/records.jsonl``."""
    records, found = await demonstrate(run / "sft" / "records.jsonl", cfg, selection, renderer, console)
    if cfg.demonstrations == "teacher":
        taught = summarise_records(records)
        console.print(
            f"  the teacher resolved {taught.resolved:.1%} of the pool (its mistakes are in the demonstrations)"
        )
    save_demonstrations(run / "sft" / "demonstrations.jsonl", found.demonstrations)
    return found.demonstrations


def imported_demonstrations(run: Path, cfg: Config, renderer, console: Console) -> list[Demonstration]:
    """Phase 4a with ``--sft-data``: the rows of its ATIF trajectories (``trainer/sft_data.py``)
    instead of recorded demonstrations, for the policy in ``run/init`` (its tokenizer decides whether
    a trajectory's ids are its own); what was not trained, counted by reason, is printed and kept
    in ``run/sft/sft-data.json``; the rows go to ``run/sft/demonstrations.jsonl`` as recorded ones do."""
    paths = [given.strip() for given in cfg.sft_data.split(",") if given.strip()]
    try:
        data = load_sft_data(
            paths,
            renderer,
            max_context=cfg.max_context or DEFAULT_MAX_CONTEXT,
            fingerprint=tokenizer_fingerprint(run / "init"),
            tokens=cfg.sft_data_tokens,
        )
    except ValueError as exc:
        raise ConfigError(f"--sft-data: {exc}") from exc
    console.print(f"  --sft-data: {data.describe()}")
    write_report(run / "sft" / "sft-data.json", data)
    if not data.rows:
        raise ConfigError(f"--sft-data: no agent step to train on ({data.describe()})")
    rows = zip(data.tasks, data.commands, data.rows)
    demos = [Demonstration(task, commands, ids, mask) for task, commands, (ids, mask) in rows]
    save_demonstrations(run / "sft" / "demonstrations.jsonl", demos)
    return demos


async def demonstrate(records_file: Path, cfg: Config, tasks: list[Task], renderer, console: Console, what: str = ""):
    """Run the demonstrations of ``tasks`` (``demonstrated_commands``); every trial's record goes
    to ``records_file``. Returns the records in task order and the demonstrations."""
    records: list[TrialRecord] = []
    teacher = cfg.demonstrations == "teacher"
    with progress_bar(console) as progress:
        label = what or ("4/7 the teacher's trajectories" if teacher else "4/7 reference trajectories")
        bar = progress.add_task(label, total=len(tasks))

        def recorded(record: TrialRecord) -> None:
            append_record(records_file, record)
            records.append(record)
            progress.advance(bar)

        found = await collect_demonstrations(
            tasks,
            demonstrated_commands(cfg),
            rollout_options(cfg, f"reference-{records_file.parent.parent.name}"),
            renderer,
            rollout_settings(cfg),
            concurrency=cfg.concurrency,
            on_record=recorded,
            resolved_only=not teacher,
        )
    if found.problems:
        raise ConfigError(f"{found.problems[0]}: the policy could never complete that task (raise the budget)")
    order = {task.name: i for i, task in enumerate(tasks)}
    return sorted(records, key=lambda r: order.get(r.task, len(order))), found


async def teacher_held_out(run: Path, cfg: Config, renderer, tasks: list[Task], console: Console) -> EvalSummary:
    """The scripted teacher on the held-out set, through the same loop (records in
    ``run/eval/teacher.jsonl``): the rate the policy's is measured against."""
    records, _ = await demonstrate(
        run / "eval" / "teacher.jsonl", cfg, tasks, renderer, console, "the teacher on the held-out set"
    )
    summary = summarise_records(records)
    console.print(f"  teacher: resolved {summary.resolved:.1%}, mean assertions passed {summary.passed:.2f}")
    return summary
