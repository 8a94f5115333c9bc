"""The ``termgym`` command line: check, shell, run, audit, list, demo, gc.

Exit codes: 0 when the trials ran (whatever they scored), 2 for bad usage or an invalid task (one
line on stderr, no traceback), 1 for an infrastructure failure (the trial's record says which).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable, Coroutine, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from termgym.env import SUBMIT, AsyncTerminalEnv, EnvOptions, resolve_task
from termgym.errors import ConfigError, TermgymError
from termgym.images.build import load_aliases
from termgym.output import plain_text as plain
from termgym.output import terminal_safe
from termgym.progress import progress_bar
from termgym.records import TrialRecord, append_record
from termgym.sandboxes import BACKENDS, close_backends, preflight, remove_leftovers
from termgym.sandboxes.pacing import Pacer
from termgym.scheduling import simclock
from termgym.scheduling.bias import TABLE_COLUMNS, BiasReport, summary_line, table_rows
from termgym.scheduling.scheduler import (
    MODES,
    RolloutScheduler,
    SchedulerConfig,
    TaskPool,
    TrialRunner,
    make_nodes,
    step_metrics,
)
from termgym.scheduling.simulated import SimulatedAgent, SimulatedBackend
from termgym.tamper import TAMPER_POLICIES
from termgym.tasks import Task, discover_tasks
from termgym.trial import AGENTS, Agent, make_agent, run_trial, run_trials

INFRA_ERRORS = ("sandbox_error", "build_failed")
# Piped output is not wrapped at 80 columns: tables stay one row per line for tools and logs.
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)
out = Console(highlight=False, width=None if sys.stdout.isatty() else 160)


class UsageError(ConfigError):
    """Bad command-line input: reported in one line, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, not argparse's usage block
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="termgym", description="Terminal tasks for training LLM agents with RL.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def backend_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--backend", default="local", choices=BACKENDS, help="sandbox backend (default: local)")
        sub.add_argument(
            "--image-alias",
            action="append",
            default=[],
            metavar="NAME=IMAGE",
            help="build FROM IMAGE where the Dockerfile names NAME and NAME is absent (docker; repeatable)",
        )

    def tamper_option(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--tamper",
            choices=TAMPER_POLICIES,
            default="warn",
            help="when the agent changed system paths the verifier may run (docker): warn records them, fail scores 0 (default: warn)",
        )

    check = commands.add_parser("check", help="run one trial of a task and show its assertions")
    check.add_argument("task", help="task directory or bundled task name")
    backend_option(check)
    tamper_option(check)
    check.add_argument(
        "--agent", default="oracle", choices=sorted(AGENTS), help="oracle = reference solution, null = submit at once"
    )
    check.add_argument("--json", action="store_true", help="print the trial record alone, as JSON, on stdout")

    shell = commands.add_parser("shell", help="step a task's environment interactively")
    shell.add_argument("task")
    backend_option(shell)
    shell.add_argument("--max-turns", type=int, default=1000)

    run = commands.add_parser("run", help="run many trials concurrently and write JSONL records")
    run.add_argument("tasks", nargs="+", help="task directories, directories of tasks, or bundled names")
    backend_option(run)
    tamper_option(run)
    run.add_argument("--agent", default="oracle", choices=sorted(AGENTS))
    run.add_argument("-n", "--concurrency", type=int, default=4)
    run.add_argument("-k", "--attempts", type=int, default=1, help="trials per task")
    run.add_argument("--out", type=Path, default=None, help="run directory (default runs/<time>-<id>)")
    run.add_argument("--batch", type=int, default=None, help="trials kept per step (default: all of them, in one step)")
    run.add_argument(
        "--oversample",
        type=int,
        default=None,
        metavar="N",
        help="trials launched per step (default: batch x 560/512; wait mode launches the batch)",
    )
    run.add_argument(
        "--mode",
        choices=MODES,
        default=None,
        help="what happens to the tail once the batch is full (default: cancel with --batch, else wait)",
    )
    run.add_argument("--nodes", type=int, default=1, help="rollout nodes (default 1)")
    run.add_argument(
        "--node-cap",
        default=None,
        metavar="C[,C...]",
        help="trials at once per node, one value or one per node (default: -n)",
    )
    run.add_argument("--steps", type=int, default=1, help="steps of --batch kept trials (default 1)")
    run.add_argument("--seed", type=int, default=0, help="task order (with --batch) and simulation seed")
    run.add_argument(
        "--simulate", action="store_true", help="simulated sandboxes and agent on a virtual clock (latency model)"
    )

    audit = commands.add_parser("audit", help="audit tasks: keep only those whose verifiers can be trusted")
    audit.add_argument("tasks", nargs="+", help="task directories, directories of tasks, or bundled names")
    backend_option(audit)
    audit.add_argument("-k", "--k", type=int, default=3, help="oracle runs in fresh sandboxes (default 3)")
    audit.add_argument("-n", "--concurrency", type=int, default=2, help="tasks audited at once (default 2)")
    audit.add_argument("--json", action="store_true", help="print the verdicts as JSON on stdout")
    audit.add_argument(
        "--select", type=Path, default=None, metavar="OUT", help="write the accepted tasks, best first, one per line"
    )
    audit.add_argument("--min-score", type=float, default=None, help="weighted score a task needs (default 0.5)")
    audit.add_argument(
        "--judge-url", default=None, help="OpenAI-compatible endpoint for the rubric judge (default: not run)"
    )
    audit.add_argument("--judge-model", default=None, help="model name for --judge-url")
    audit.add_argument("--strict", action="store_true", help="exit 1 when any task is rejected")
    audit.add_argument(
        "--cache",
        type=Path,
        default=None,
        metavar="FILE",
        help="verdicts by task content: unchanged tasks are not audited again; new verdicts are added",
    )
    commands.add_parser("list", help="list the bundled tasks")
    demo = commands.add_parser("demo", help="check every bundled task with the oracle and the null agent")
    demo.add_argument("-n", "--concurrency", type=int, default=2)
    gc = commands.add_parser("gc", help="remove sandboxes left behind by killed runs")
    backend_option(gc)
    gc.add_argument("--images", action="store_true", help="also remove cached task images (docker)")
    images = commands.add_parser("images", help="manage the Docker backend's images")
    images.add_argument("action", choices=["bootstrap"], help="bootstrap: build termgym/base:bookworm with debootstrap")
    images.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    # Listed here for --help; main() hands everything after "train" to the trainer's own parser.
    commands.add_parser(
        "train", help="train an agent with PPO (termgym train --help; needs the train extra)", add_help=False
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return _one_line_errors(lambda: _dispatch(argv))


def run_command(command: Coroutine[Any, Any, int]) -> int:
    """Run an async command to its exit code, then close the backends' shared clients, with
    termgym's exit codes (below); for the benchmarks' entry points."""
    return _one_line_errors(lambda: asyncio.run(_closing_backends(command)))


def _one_line_errors(call: Callable[[], int]) -> int:
    """``call()``'s exit code; bad input is one line and exit 2, an infrastructure fault one line
    and exit 1, Ctrl-C exit 130: never a traceback."""
    try:
        return call()
    except ConfigError as exc:  # bad input (a TaskError too); any other exception is a bug, not the user's
        return _fail(2, f"error: {exc}")
    except TermgymError as exc:
        return _fail(1, f"{exc.kind}: {exc}")
    except KeyboardInterrupt:
        return _fail(130, "interrupted")


def _dispatch(argv: list[str]) -> int:
    if argv[:1] == ["train"]:
        return cmd_train(argv[1:])
    args = build_parser().parse_args(argv)
    handler = {
        "check": cmd_check,
        "shell": cmd_shell,
        "run": cmd_run,
        "list": cmd_list,
        "demo": cmd_demo,
        "gc": cmd_gc,
        "images": cmd_images,
        "audit": cmd_audit,
    }
    return asyncio.run(_closing_backends(handler[args.command](args)))


def cmd_train(argv: Sequence[str]) -> int:
    """``termgym train ...``: the trainer's own command line. The trainer plugs in as the ``train``
    entry point of the ``termgym.commands`` group (pyproject.toml), so termgym never imports it."""
    found = entry_points(group="termgym.commands", name="train")
    if not found:
        raise UsageError("the trainer is not installed (pip install -e '.[train]')")
    try:
        train_main = next(iter(found)).load()
    except ImportError as exc:
        raise UsageError(f"the trainer needs the train extra (pip install -e '.[train]'): {exc}") from exc
    return train_main(argv)


async def _closing_backends(command: Coroutine[Any, Any, int]) -> int:
    """Run a command, then close the backends' shared clients (their HTTP sessions)."""
    try:
        return await command
    finally:
        await close_backends()


def _fail(code: int, message: str) -> int:
    """One line on stderr, never wrapped, without terminal controls, then the exit code."""
    print(f"termgym: {terminal_safe(' '.join(message.split()))}", file=sys.stderr)
    return code


# -- check -------------------------------------------------------------------------------------------


async def cmd_check(args: argparse.Namespace) -> int:
    task = resolve_task(args.task)
    await asyncio.to_thread(preflight, args.backend)
    options = EnvOptions(
        backend=args.backend,
        run_id=f"check-{uuid.uuid4().hex[:8]}",
        image_aliases=load_aliases(args.image_alias),
        tamper=args.tamper,
    )
    record = await run_trial(task, make_agent(args.agent), options)
    if args.json:
        print(record.to_json())
    else:
        print_record(record)
    return 1 if record.error and record.error["kind"] in INFRA_ERRORS else 0


def print_record(record: TrialRecord) -> None:
    header = plain(f" · agent {record.agent} · backend {record.backend}")
    out.print(Text.assemble((terminal_safe(record.task), "bold"), header))
    table = Table()
    table.add_column("assertion")
    table.add_column("result", justify="center")
    for assertion in record.assertions:
        table.add_row(plain(assertion["name"]), "[green]pass[/]" if assertion["passed"] else "[red]FAIL[/]")
    out.print(table)
    verdict = "[green]resolved[/]" if record.resolved else "[red]not resolved[/]"
    out.print(
        Text.assemble(
            Text.from_markup(verdict),
            plain(
                f" · reward {record.reward:.3f} · {record.passed}/{record.total} assertions"
                f" ({record.report_format}) · {record.turns} turns · {record.timings.get('total', 0):.1f}s"
            ),
        )
    )
    for warning in record.warnings:
        out.print(Text.assemble(("warning", "yellow"), plain(f" {warning}")))
    if record.error:
        out.print(Text.assemble(("error", "yellow"), plain(f" {record.error['kind']}: {record.error['message']}")))


# -- shell -------------------------------------------------------------------------------------------


async def cmd_shell(args: argparse.Namespace) -> int:
    task = resolve_task(args.task)
    await asyncio.to_thread(preflight, args.backend)
    options = EnvOptions(
        backend=args.backend,
        max_turns=args.max_turns,
        run_id=f"shell-{uuid.uuid4().hex[:8]}",
        image_aliases=load_aliases(args.image_alias),
    )
    async with AsyncTerminalEnv(task, options) as env:
        instruction, info = await env.reset()
        header = plain(f" ({info['backend']}) · {SUBMIT} verifies · :quit leaves\n")
        out.print(Text.assemble((terminal_safe(task.name), "bold"), header))
        out.print(plain(instruction))
        for warning in info["warnings"]:
            err.print(plain(f"warning: {warning}"))
        cwd = info["workdir"]
        while True:
            try:
                line = await asyncio.to_thread(_read_command, terminal_safe(f"{cwd}$ "))
            except EOFError:
                line = ":quit"
            if line is None or not line.strip():
                continue
            if line.strip() == ":quit":
                return 0
            action = SUBMIT if line.strip() == SUBMIT else line
            obs, reward, terminated, truncated, step_info = await env.step(action)
            if obs:
                shown = terminal_safe(obs)
                out.print(Text(shown), end="" if shown.endswith("\n") else "\n")
            cwd = step_info.get("cwd") or cwd
            if terminated or truncated:
                _print_final(task, step_info, reward)
                return 0


def _read_command(prompt: str) -> str | None:
    lines = [input(prompt)]
    while lines[-1].endswith("\\"):
        lines.append(input("> "))
    return "\n".join(lines)


def _print_final(task: Task, info: dict, reward: float) -> None:
    record = TrialRecord(task=task.name, backend="", agent="human", reward=reward)
    record.assertions = info.get("assertions", [])
    record.resolved, record.passed, record.total = (
        info.get("resolved", False),
        info.get("passed", 0),
        info.get("total", 0),
    )
    record.report_format, record.error = info.get("report_format"), info.get("error")
    record.warnings = list(info.get("warnings", []))
    record.agent = "you"
    print_record(record)


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
    with progress_bar(err) as progress:
        bar = progress.add_task("trials", total=len(jobs))

        def on_record(record: TrialRecord, agent: Agent) -> None:
            append_record(records_path, record)
            progress.advance(bar)

        options = EnvOptions(backend=backend, run_id=run_id)
        return await run_trials(
            [(task, make_agent(agent)) for task, agent in jobs], options, concurrency=concurrency, on_record=on_record
        )


async def cmd_run(args: argparse.Namespace) -> int:
    """Steps of the rollout scheduler (``termgym.scheduling.scheduler``). Without ``--batch``: one step in
    mode wait that keeps every trial (each task ``-k`` times, at most ``-n`` at once)."""
    if args.attempts < 1:
        raise UsageError(f"--attempts must be at least 1, got {args.attempts}")
    jobs = [task for task in collect_tasks(args.tasks) for _ in range(args.attempts)]
    config = run_config(args, len(jobs))
    if not args.simulate:
        await asyncio.to_thread(preflight, args.backend)
    run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    out_dir = args.out or Path("runs") / run_id
    pool = TaskPool(jobs, shuffle=args.batch is not None, seed=args.seed)
    schedule = run_steps(args, config, pool, run_id, out_dir)
    # A simulation runs on its own virtual-time loop, in a thread, so the real clock is not involved.
    records, run_report, short = await (asyncio.to_thread(simclock.run, schedule) if args.simulate else schedule)
    print_summary(records)
    print_bias_table(run_report, config.mode, args.steps)
    err.print(f"records: {out_dir / 'trials.jsonl'} · metrics: {out_dir / 'metrics.jsonl'}", markup=False)
    return 1 if short else 0


def run_config(args: argparse.Namespace, jobs: int) -> SchedulerConfig:
    for name in ("concurrency", "nodes", "steps"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name} must be at least 1, got {getattr(args, name)}")
    caps_text = args.node_cap or str(args.concurrency)
    try:
        caps = [int(c) for c in caps_text.split(",")]
    except ValueError:
        raise UsageError(f"--node-cap takes whole numbers, got {caps_text!r}") from None
    if len(caps) == 1:
        caps *= args.nodes
    if len(caps) != args.nodes or min(caps) < 1:
        raise UsageError(f"--node-cap needs one cap or {args.nodes} caps (one per node), each at least 1")
    try:
        return SchedulerConfig(
            batch_size=args.batch if args.batch is not None else jobs,
            launch=args.oversample,
            mode=args.mode or ("cancel" if args.batch is not None else "wait"),
            nodes=make_nodes(caps),
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


async def run_steps(
    args: argparse.Namespace, config: SchedulerConfig, pool: TaskPool, run_id: str, out_dir: Path
) -> tuple[list[TrialRecord], BiasReport, int]:
    """Run ``args.steps`` steps; every record goes to ``trials.jsonl`` as soon as its trial is decided,
    every step's accounting to ``metrics.jsonl``, and a summary line per step to stderr."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pacer = Pacer()
    if args.simulate:
        simulated = SimulatedBackend(seed=args.seed)
        runner = TrialRunner(SimulatedAgent(), simulated.options(run_id), pacer, sandbox_factory=simulated)
    else:
        options = EnvOptions(
            backend=args.backend, run_id=run_id, image_aliases=load_aliases(args.image_alias), tamper=args.tamper
        )
        runner = TrialRunner(make_agent(args.agent), options, pacer)
    records: list[TrialRecord] = []
    short = 0
    with progress_bar(err) as progress:
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
                with open(out_dir / "metrics.jsonl", "a", encoding="utf-8") as metrics:
                    metrics.write(json.dumps(step_metrics(result)) + "\n")
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
    out.print(table)
    out.print(
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
    out.print(table)


async def cmd_demo(args: argparse.Namespace) -> int:
    from termgym.bundled import bundled_root

    tasks = discover_tasks(bundled_root())
    run_id = f"demo-{uuid.uuid4().hex[:6]}"
    records_path = Path("runs") / run_id / "trials.jsonl"
    jobs = [(task, agent) for task in tasks for agent in ("oracle", "null")]
    err.print(f"checking {len(tasks)} bundled tasks with the oracle and the null agent", markup=False)
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
    out.print(table)
    out.print(
        f"{healthy}/{len(tasks)} tasks: the oracle resolves them and doing nothing does not · records: {records_path}"
    )
    return 0 if healthy == len(tasks) else 1


# -- audit -------------------------------------------------------------------------------------------


async def cmd_audit(args: argparse.Namespace) -> int:
    """Exit 0 when the audit ran, rejects or not (they are in the table); 1 with --strict and a reject."""
    from termgym.audit.runner import run_audit

    return await run_audit(args, collect_tasks(args.tasks), out)


# -- list and gc -------------------------------------------------------------------------------------


async def cmd_list(args: argparse.Namespace) -> int:
    from termgym.bundled import bundled_root

    table = Table(title="bundled tasks", title_justify="left")
    for column in ("task", "family", "agent timeout", "instruction"):
        table.add_column(column)
    for task in discover_tasks(bundled_root()):
        lines = terminal_safe(task.instruction).strip().splitlines()
        first_line = lines[0][:70] if lines else ""
        table.add_row(plain(task.name), plain(task.family), f"{task.agent_timeout_sec:g}s", plain(first_line))
    out.print(table)
    return 0


async def cmd_gc(args: argparse.Namespace) -> int:
    out.print(await remove_leftovers(args.backend, images=args.images))
    return 0


async def cmd_images(args: argparse.Namespace) -> int:
    from termgym.images.build import BASE_IMAGE, bootstrap_base_image
    from termgym.sandboxes.docker import docker_client

    client = docker_client()
    err.print(f"building {BASE_IMAGE} with debootstrap (about 20 s) unless it exists", markup=False)
    built = await asyncio.to_thread(bootstrap_base_image, client, force=args.force)
    out.print(f"{BASE_IMAGE}: {'built' if built else 'already present'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
