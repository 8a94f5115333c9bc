"""The ``termgym`` command line: check, shell, run, replay, report, export, audit, list, demo, gc,
images, gateway, train.

Exit codes: 0 when the trials ran (whatever they scored), 2 for bad usage or an invalid task (one
line on stderr, no traceback), 1 for an infrastructure failure (the trial's record says which).
Settings may also come from ``termgym.toml`` (``[model]``, ``[run]``, ``[check]``...); flags win.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable, Coroutine, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from termgym.cli.common import (
    Parser,
    UsageError,
    agent_options,
    apply_config_file,
    backend_option,
    run_overrides_options,
    tamper_option,
)
from termgym.cli.episodes import cmd_check, cmd_replay
from termgym.cli.export import cmd_export
from termgym.cli.gateway import cmd_gateway, gateway_options
from termgym.cli.maintenance import cmd_audit, cmd_gc, cmd_images, cmd_list
from termgym.cli.report import cmd_report
from termgym.cli.runs import cmd_demo, cmd_run
from termgym.cli.shell import cmd_shell
from termgym.errors import ConfigError, TermgymError
from termgym.output import terminal_safe
from termgym.sandboxes import close_backends
from termgym.scheduling.scheduler import MODES

__all__ = ["UsageError", "build_parser", "main", "run_command"]


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="termgym", description="Terminal tasks for training LLM agents with RL.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    check = commands.add_parser("check", help="run one trial of a task and show its assertions")
    check.add_argument("task", help="task directory or bundled task name")
    backend_option(check)
    tamper_option(check)
    agent_options(check)
    run_overrides_options(check)
    check.add_argument("--json", action="store_true", help="print the trial record alone, as JSON, on stdout")
    check.add_argument(
        "--out",
        type=Path,
        default=None,
        help="run directory: the record appended to OUT/trials.jsonl, the transcript in OUT/trials/"
        " (default runs/check-<id>)",
    )
    check.add_argument(
        "-v", "--verbose", action="store_true", help="all of the verifier's output (and the build log), not its tail"
    )
    check.add_argument(
        "--keep",
        action="store_true",
        help="leave the sandbox running after the trial (enter: termgym shell --attach ID)",
    )

    shell = commands.add_parser("shell", help="step a task's environment interactively")
    shell.add_argument("task", nargs="?", help="task directory or bundled task name (not with --attach)")
    backend_option(shell, cluster=False)
    run_overrides_options(shell)
    shell.add_argument("--max-turns", type=int, default=1000)
    shell.add_argument("--attach", default=None, metavar="ID", help="enter a sandbox kept by check --keep")
    shell.add_argument(
        "--keep", action="store_true", help="leave the sandbox running when the session ends (enter again: --attach ID)"
    )

    run = commands.add_parser("run", help="run many trials concurrently and write JSONL records")
    run.add_argument("tasks", nargs="+", help="task directories, directories of tasks, or bundled names")
    backend_option(run)
    tamper_option(run)
    run_overrides_options(run)
    agent_options(run)
    run.add_argument("-n", "--concurrency", type=int, default=4)
    run.add_argument("-k", "--attempts", type=int, default=1, help="trials per task (pass@k for every k up to it)")
    run.add_argument("--out", type=Path, default=None, help="run directory (default runs/<time>-<id>)")
    run.add_argument(
        "--resume",
        action="store_true",
        help="with --out: run only the trials the run directory lacks or lost to faults",
    )
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
    run.add_argument(
        "--track",
        default=None,
        metavar="{tensorboard,wandb}",
        help="also send each step's accounting and the summary to TensorBoard (RUN/tensorboard) or W&B (RUN/wandb,"
        " offline unless WANDB_MODE says otherwise); the track extra",
    )

    audit = commands.add_parser("audit", help="audit tasks: keep only those whose verifiers can be trusted")
    audit.add_argument("tasks", nargs="+", help="task directories, directories of tasks, or bundled names")
    backend_option(audit)
    run_overrides_options(audit)
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
    replay = commands.add_parser("replay", help="show a trial's transcript (RUN/trials/ID)")
    replay.add_argument("trial", type=Path, help="a trial directory or its trajectory.json")
    replay.add_argument("--lines", type=int, default=12, help="output lines shown per command, head and tail")
    report = commands.add_parser("report", help="write a run's report: one self-contained HTML file")
    report.add_argument("run_dir", type=Path, help="a run directory (with trials.jsonl)")
    report.add_argument("--out", type=Path, default=None, help="the HTML file (default RUN_DIR/report.html)")
    export = commands.add_parser(
        "export", help="write a run's trials in another format (atif: one ATIF trajectory per trial)"
    )
    export.add_argument("format", choices=["atif"], help="atif: Harbor's Agent Trajectory Interchange Format (v1.7)")
    export.add_argument(
        "run", type=Path, help="a run directory (termgym run, check, train), a trial directory or a trajectory.json"
    )
    export.add_argument("--out", type=Path, required=True, help="the directory the trajectory files go to")
    commands.add_parser("list", help="list the bundled tasks")
    demo = commands.add_parser("demo", help="check every bundled task with the oracle and the null agent")
    demo.add_argument("-n", "--concurrency", type=int, default=2)
    gc = commands.add_parser("gc", help="remove sandboxes left behind by killed runs")
    backend_option(gc)
    gc.add_argument(
        "--images",
        action="store_true",
        help="also remove task images: docker, the ones termgym built; local, the unpacked images no sandbox uses",
    )
    gc.add_argument("ids", nargs="*", metavar="ID", help="remove only these sandboxes kept by --keep")
    images = commands.add_parser("images", help="manage the Docker backend's images")
    images.add_argument("action", choices=["bootstrap"], help="bootstrap: build termgym/base:bookworm with debootstrap")
    images.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    gateway = commands.add_parser(
        "gateway", help="the recording model gateway in front of an OpenAI-compatible server (for any harness)"
    )
    gateway_options(gateway)
    # Listed here for --help; main() hands everything after "train" to the trainer's own parser.
    commands.add_parser(
        "train", help="train an agent with PPO (termgym train --help; needs the train extra)", add_help=False
    )
    parser.commands = commands.choices  # type: ignore[attr-defined]  # name -> subparser, for the config file
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
    parser = build_parser()
    command = parser.commands.get(argv[0]) if argv else None  # type: ignore[attr-defined]
    if command is not None:
        apply_config_file(command, argv[0])
    args = parser.parse_args(argv)
    handler = {
        "check": cmd_check,
        "shell": cmd_shell,
        "run": cmd_run,
        "replay": cmd_replay,
        "list": cmd_list,
        "demo": cmd_demo,
        "gc": cmd_gc,
        "images": cmd_images,
        "audit": cmd_audit,
        "report": cmd_report,
        "export": cmd_export,
        "gateway": cmd_gateway,
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
