"""The commands that run many trials: ``run`` (the rollout scheduler, transcripts, the evaluation
summary, ``--resume``) and ``demo`` (every bundled task, oracle against null)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from rich.table import Table

from termgym.agents import ModelAgent, make_agent
from termgym.agents.heap import settled_heap
from termgym.cli import common
from termgym.cli.common import UsageError, agent_from_args, close_agent, env_options
from termgym.cli.summary import is_scored, summarize
from termgym.episode.options import EnvOptions
from termgym.integrations.harness import HarnessAgent
from termgym.output import plain_text as plain
from termgym.progress import progress_bar
from termgym.records import TrialRecord, append_record, read_records
from termgym.sandboxes import preflight
from termgym.sandboxes.pacing import Pacer
from termgym.scheduling import simclock
from termgym.scheduling.bias import TABLE_COLUMNS, BiasReport, summary_line, table_rows
from termgym.scheduling.pool import TaskPool, cluster_nodes, make_nodes
from termgym.scheduling.runners import TrialRunner
from termgym.scheduling.scheduler import RolloutScheduler, SchedulerConfig, step_metrics
from termgym.scheduling.simulated import SimulatedAgent, SimulatedBackend
from termgym.tasks import Task, discover_tasks
from termgym.tasks.bundled import resolve_task
from termgym.tracking import Tracker, flatten, open_tracker, require_tracker
from termgym.trial import Agent, run_trials

# -- run and demo ------------------------------------------------------------------------------------


def collect_tasks(names: Sequence[str]) -> list[Task]:
    tasks: list[Task] = []
    for name in names:
        path = Path(name)
        tasks += discover_tasks(path) if path.is_dir() and not _is_task_dir(path) else [resolve_task(name)]
    if not tasks:
        raise UsageError("no tasks found")
    return tasks


def _is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file() or (path / "task.yaml").is_file()


async def run_many(
    jobs: Sequence[tuple[Task, str]], *, backend: str, concurrency: int, records_path: Path, run_id: str
) -> list[TrialRecord]:
    """Run (task, agent) trials with at most ``concurrency`` at once; every record is appended to
    ``records_path`` as soon as its trial ends."""
    if concurrency < 1:
        raise UsageError(f"concurrency must be at least 1, got {concurrency}")
    with progress_bar(common.err) as progress:
        bar = progress.add_task("trials", total=len(jobs))

        def on_record(record: TrialRecord, agent: Agent) -> None:
            append_record(records_path, record)
            progress.advance(bar)

        options = EnvOptions(backend=backend, run_id=run_id, trials_dir=str(records_path.parent / "trials"))
        return await run_trials(
            [(task, make_agent(agent)) for task, agent in jobs], options, concurrency=concurrency, on_record=on_record
        )


async def cmd_run(args: argparse.Namespace) -> int:
    """Steps of the rollout scheduler (``termgym.scheduling.scheduler``). Without ``--batch``: one step in
    mode wait that keeps every trial (each task ``-k`` times, at most ``-n`` at once). Every trial's
    transcript goes to ``RUN/trials/<trial id>/``; the evaluation summary to ``RUN/summary.json``.
    With ``--track``, each step's accounting and the summary also go to TensorBoard or W&B
    (``termgym.tracking``), under ``scheduler/`` and ``summary/``."""
    if args.attempts < 1:
        raise UsageError(f"--attempts must be at least 1, got {args.attempts}")
    if args.resume and args.out is None:
        raise UsageError("--resume needs --out RUN_DIR (the run to resume)")
    if args.resume and args.batch is not None:
        raise UsageError("--resume counts trials per task: it does not combine with --batch")
    if args.track:
        require_tracker(args.track)
    tasks = collect_tasks(args.tasks)
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    out_dir = args.out or Path("runs") / run_id
    earlier: list[dict] = []
    if args.resume and (out_dir / "trials.jsonl").is_file():
        earlier = read_records(out_dir / "trials.jsonl")
    kept, jobs = resume_plan(tasks, args.attempts, earlier)
    agent = None if args.simulate else agent_from_args(args, connections=args.concurrency)
    try:
        if not jobs:
            common.err.print(f"nothing to run: {out_dir} has {len(kept)} finished trials", markup=False)
            _report(out_dir, kept)
            return 0
        config = run_config(args, len(jobs))
        if not args.simulate and not args.cluster:  # a cluster's nodes run the backend, not this machine
            await asyncio.to_thread(preflight, args.backend)
        pool = TaskPool(jobs, shuffle=args.batch is not None, seed=args.seed)
        tracker = open_tracker(args.track, out_dir, run_flags(args), out_dir.name) if args.track else None
        with tracker or contextlib.nullcontext():
            schedule = run_steps(args, agent, config, pool, run_id, out_dir, tracker)
            # many live model episodes: rare, short garbage collections (termgym.agents.heap)
            with settled_heap() if isinstance(agent, (ModelAgent, HarnessAgent)) else contextlib.nullcontext():
                # A simulation runs on its own virtual-time loop, in a thread, so the real clock is not involved.
                records, run_report, short = await (
                    asyncio.to_thread(simclock.run, schedule) if args.simulate else schedule
                )
            print_summary(records)
            print_bias_table(run_report, config.mode, args.steps)
            summary = _report(out_dir, kept + [asdict(r) for r in records])
            if tracker is not None:
                track_summary(tracker, summary, args.steps)
    finally:
        if agent is not None:
            await close_agent(agent)
    common.err.print(f"records: {out_dir / 'trials.jsonl'} · metrics: {out_dir / 'metrics.jsonl'}", markup=False)
    return 1 if short else 0


def run_flags(args: argparse.Namespace) -> dict:
    """The run's flags, as a tracker's hyperparameters (paths as strings)."""
    return {name: str(value) if isinstance(value, Path) else value for name, value in vars(args).items()}


def track_summary(tracker: Tracker, summary: dict, step: int) -> None:
    """The evaluation summary at ``step`` (the run's last): every number of ``summary.json`` under
    ``summary/``, and the per-family table the run prints."""
    tracker.log(flatten(summary, "summary"), step)
    rows = [
        [family, rates["trials"], rates["resolved_rate"], rates["mean_reward"]]
        for family, rates in summary["families"].items()
    ]
    tracker.table("summary/families", ["family", "trials", "resolved", "reward"], rows, step)


def resume_plan(tasks: Sequence[Task], attempts: int, earlier: Sequence[dict]) -> tuple[list[dict], list[Task]]:
    """The earlier records a resumed run keeps (per task, up to ``attempts`` that finished without
    an infrastructure fault) and the trials still to run, in task order."""
    kept: list[dict] = []
    done: dict[str, int] = {}
    for record in earlier:
        if is_scored(record) and done.get(record["task"], 0) < attempts:
            done[record["task"]] = done.get(record["task"], 0) + 1
            kept.append(record)
    jobs = [task for task in tasks for _ in range(attempts - done.get(task.name, 0))]
    return kept, jobs


def _report(out_dir: Path, records: Sequence[dict]) -> dict:
    """Print the evaluation summary and write it to ``summary.json``; returns it."""
    summary = summarize(records)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print_evaluation(summary)
    common.err.print(f"summary: {out_dir / 'summary.json'}", markup=False)
    return summary


def print_evaluation(summary: dict) -> None:
    """Resolved rate (95% interval), pass@k, mean reward and assertions, overall and per family."""
    ks = list(summary.get("pass_at_k", {}))
    table = Table(title="evaluation", title_justify="left")
    for column in (
        "family",
        "tasks",
        "trials",
        "resolved",
        "95% interval",
        *(f"pass@{k}" for k in ks),
        "reward",
        "assertions",
    ):
        table.add_column(column, justify="left" if column == "family" else "right")

    def row(name: str, rates: dict) -> list:
        low, high = rates["resolved_ci95"]
        passes = [f"{rates['pass_at_k'][k]:.3f}" if k in rates["pass_at_k"] else "-" for k in ks]
        return [
            plain(name),
            str(rates["tasks"]),
            str(rates["trials"]),
            f"{rates['resolved_rate']:.3f}",
            f"[{low:.3f}, {high:.3f}]",
            *passes,
            f"{rates['mean_reward']:.3f}",
            f"{rates['mean_assertions_passed']:.3f}",
        ]

    for family, rates in summary["families"].items():
        table.add_row(*row(family, rates))
    table.add_row(*row("all", summary), style="bold")
    common.out.print(table)
    notes = [f"stop reasons: {', '.join(f'{k} {v}' for k, v in summary['stop_reasons'].items())}"]
    if summary["excluded"]:
        excluded = ", ".join(f"{k} {v}" for k, v in summary["excluded"].items())
        notes.append(f"left out (infrastructure): {excluded}; --resume runs them again")
    if summary["parse_errors"]:
        notes.append(f"replies that did not parse: {summary['parse_errors']}")
    usage = summary["usage"]
    if usage.get("requests"):
        notes.append(
            f"tokens: {usage.get('prompt_tokens', 0)} prompt, {usage.get('completion_tokens', 0)} completion"
            f" over {usage['requests']} requests"
        )
    for note in notes:
        common.out.print(plain(note))


def run_config(args: argparse.Namespace, jobs: int) -> SchedulerConfig:
    for name in ("concurrency", "nodes", "steps"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be at least 1, got {getattr(args, name)}")
    caps_text = args.node_cap or str(args.concurrency)
    try:
        caps = [int(c) for c in caps_text.split(",")]
    except ValueError:
        raise UsageError(f"--node-cap takes whole numbers, got {caps_text!r}") from None
    node_up = None
    if getattr(args, "cluster", None):  # the nodes are the cluster's, each with its own cap
        if args.node_cap and "," in args.node_cap:
            raise UsageError("with --cluster, --node-cap takes one cap for every node")
        cap = int(caps[0]) if args.node_cap else None
        nodes, node_up = cluster_nodes(args.cluster, args.backend, cpus_per_sandbox=args.cpus_per_sandbox, node_cap=cap)
    else:
        if len(caps) == 1:
            caps *= args.nodes
        if len(caps) != args.nodes or min(caps) < 1:
            raise UsageError(f"--node-cap needs one cap or {args.nodes} caps (one per node), each at least 1")
        nodes = make_nodes(caps)
    try:
        return SchedulerConfig(
            batch_size=args.batch if args.batch is not None else jobs,
            launch=args.oversample,
            mode=args.mode or ("cancel" if args.batch is not None else "wait"),
            nodes=nodes,
            node_up=node_up,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


async def run_steps(
    args: argparse.Namespace,
    agent: Agent | None,
    config: SchedulerConfig,
    pool: TaskPool,
    run_id: str,
    out_dir: Path,
    tracker: Tracker | None = None,
) -> tuple[list[TrialRecord], BiasReport, int]:
    """Run ``args.steps`` steps; every record goes to ``trials.jsonl`` as soon as its trial is decided,
    every step's accounting to ``metrics.jsonl`` (and ``tracker``, at step 1, 2...), and a summary
    line per step to stderr."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pacer = Pacer()
    if args.simulate:
        simulated = SimulatedBackend(seed=args.seed)
        runner = TrialRunner(SimulatedAgent(), simulated.options(run_id), pacer, sandbox_factory=simulated)
    else:
        assert agent is not None
        runner = TrialRunner(agent, env_options(args, run_id, out_dir / "trials"), pacer)
    records: list[TrialRecord] = []
    short = 0
    with progress_bar(common.err) as progress:
        bar = progress.add_task("kept", total=config.batch_size)

        def on_record(fate: str, record: TrialRecord) -> None:
            append_record(out_dir / "trials.jsonl", record)
            records.append(record)
            progress.advance(bar, 1 if fate == "kept" else 0)

        async with RolloutScheduler(runner, pool, config, pacer=pacer, on_record=on_record) as scheduler:
            for _ in range(args.steps):
                progress.reset(bar, description=f"step {scheduler.steps} kept", total=config.batch_size)
                result = await scheduler.step()
                short += result.short
                accounting = step_metrics(result)
                with open(out_dir / "metrics.jsonl", "a", encoding="utf-8") as metrics:
                    metrics.write(json.dumps(accounting) + "\n")
                if tracker is not None:
                    tracker.log(flatten(accounting, "scheduler"), result.step + 1)
                summary = summary_line(
                    result.step,
                    result.mode,
                    result.families,
                    result.run_families,
                    result.wall_seconds,
                    result.lower_bound,
                )
                progress.console.print(plain(summary), soft_wrap=True)
    return records, scheduler.run_families, short


def print_bias_table(report: BiasReport, mode: str, steps: int) -> None:
    """Per family, over the whole run: launched against kept (termgym.scheduling.bias defines each column)."""
    table = Table(title=f"straggler bias per family · mode {mode} · {steps} step(s)", title_justify="left")
    for column in TABLE_COLUMNS:
        table.add_column(column, justify="left" if column == "family" else "right")
    for family, *counts in table_rows(report):
        table.add_row(plain(family), *counts)
    common.out.print(table)
    common.out.print(
        f"total-variation distance, launched vs kept: {report.tv_distance:.3f}"
        f" (importance-weighted: {report.tv_distance_weighted:.3f})"
    )


def print_summary(records: Sequence[TrialRecord]) -> None:
    table = Table(title="trials", title_justify="left")
    for column in ("task", "agent", "trials", "resolved", "mean reward", "errors"):
        table.add_column(column, justify="left" if column in ("task", "agent") else "right")
    groups: dict[tuple[str, str], list[TrialRecord]] = {}
    for record in records:
        groups.setdefault((record.task, record.agent), []).append(record)
    for (task, agent), group in sorted(groups.items()):
        errors = sorted({r.error["kind"] for r in group if r.error})
        table.add_row(
            plain(task),
            plain(agent),
            str(len(group)),
            str(sum(r.resolved for r in group)),
            f"{sum(r.reward for r in group) / len(group):.3f}",
            plain(", ".join(errors) or "-"),
        )
    common.out.print(table)


async def cmd_demo(args: argparse.Namespace) -> int:
    from termgym.tasks.bundled import bundled_root

    tasks = discover_tasks(bundled_root())
    run_id = f"demo-{uuid.uuid4().hex[:6]}"
    records_path = Path("runs") / run_id / "trials.jsonl"
    jobs = [(task, agent) for task in tasks for agent in ("oracle", "null")]
    common.err.print(f"checking {len(tasks)} bundled tasks with the oracle and the null agent", markup=False)
    records = await run_many(
        jobs, backend="local", concurrency=args.concurrency, records_path=records_path, run_id=run_id
    )
    by_key = {(r.task, r.agent): r for r in records}
    table = Table(title="bundled tasks: reference solution against doing nothing", title_justify="left")
    for column in ("task", "assertions", "oracle", "null", "ok"):
        table.add_column(column, justify="left" if column == "task" else "right")
    healthy = 0
    for task in tasks:
        oracle, null = by_key[(task.name, "oracle")], by_key[(task.name, "null")]
        ok = oracle.resolved and not null.resolved and not oracle.error
        healthy += ok
        table.add_row(
            plain(task.name),
            str(oracle.total),
            f"{oracle.passed}/{oracle.total} r={oracle.reward:.2f}",
            f"{null.passed}/{null.total} r={null.reward:.2f}",
            "[green]yes[/]" if ok else "[red]no[/]",
        )
    common.out.print(table)
    common.out.print(
        f"{healthy}/{len(tasks)} tasks: the oracle resolves them and doing nothing does not · records: {records_path}"
    )
    return 0 if healthy == len(tasks) else 1
