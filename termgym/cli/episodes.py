"""The commands about one episode: ``check`` (one trial, its transcript and assertions) and
``replay`` (show a transcript); ``termgym.cli.shell`` steps an environment by hand."""

from __future__ import annotations

import argparse
import asyncio
import uuid
from pathlib import Path

from rich.table import Table
from rich.text import Text

from termgym.cli import common
from termgym.cli.common import INFRA_ERRORS, UsageError, agent_from_args, close_agent, env_options
from termgym.cli.replay import print_transcript
from termgym.output import plain_text as plain
from termgym.output import terminal_safe
from termgym.records import TrialRecord, append_record
from termgym.sandboxes import preflight
from termgym.tasks.bundled import resolve_task
from termgym.transcript import read_transcript
from termgym.trial import run_trial

# -- check -------------------------------------------------------------------------------------------


async def cmd_check(args: argparse.Namespace) -> int:
    """One trial; its transcript goes to ``OUT/trials/<trial id>/`` (``--out``, default
    ``runs/<run id>``) and is printed above the assertions (``--json``: the record alone); its
    record is appended to ``OUT/trials.jsonl``, as a run's are (``termgym export`` reads both)."""
    task = resolve_task(args.task)
    agent = agent_from_args(args)
    if args.cluster:  # a cluster's nodes run the backend, not this machine
        common.connect_cluster(args)
    else:
        await asyncio.to_thread(preflight, args.backend)
    run_id = f"check-{uuid.uuid4().hex[:8]}"
    out_dir = args.out or Path("runs") / run_id
    options = env_options(args, run_id, out_dir / "trials")
    try:
        record = await run_trial(task, agent, options)
    finally:
        await close_agent(agent)
    append_record(out_dir / "trials.jsonl", record)
    if args.json:
        print(record.to_json())
        return 1 if record.error and record.error["kind"] in INFRA_ERRORS else 0
    if record.transcript:
        print_transcript(common.out, read_transcript(record.transcript))
    print_record(record)
    print_failure_output(record, verbose=args.verbose)
    if record.transcript:
        common.err.print(f"transcript: {record.transcript}", markup=False)
    return 1 if record.error and record.error["kind"] in INFRA_ERRORS else 0


TAIL_LINES = 20  # of the verifier's output (or the build log) under a trial that is not resolved


def output_tail(text: str, lines: int | None) -> tuple[str, int]:
    """The last ``lines`` lines of ``text`` (all of them when None) and how many came before."""
    rows = text.rstrip("\n").splitlines()
    if lines is None or len(rows) <= lines:
        return "\n".join(rows), 0
    return "\n".join(rows[-lines:]), len(rows) - lines


def print_failure_output(record: TrialRecord, *, verbose: bool) -> None:
    """Under a trial that is not resolved: the tail of the build log (a build failure) or of the
    verifier's output, terminal-safe; ``verbose`` prints all of it."""
    if record.resolved:
        return
    for key, title in (("build", "build log"), ("verifier", "verifier output")):
        text = record.logs.get(key, "")
        if not text.strip():
            continue
        shown, cut = output_tail(text, None if verbose else TAIL_LINES)
        note = f" (last {TAIL_LINES} lines; -v shows all {cut + TAIL_LINES})" if cut else ""
        common.out.print(Text.assemble((f"{title}{note}", "bold"), plain(":")))
        common.out.print(Text(terminal_safe(shown)))


async def cmd_replay(args: argparse.Namespace) -> int:
    if args.lines < 1:
        raise UsageError(f"--lines must be at least 1, got {args.lines}")
    try:
        data = read_transcript(args.trial)
    except FileNotFoundError:
        raise UsageError(f"{args.trial}: no transcript there (expected RUN/trials/ID or its trajectory.json)") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(str(exc).splitlines()[0]) from None
    print_transcript(common.out, data, output_lines=args.lines)
    return 0


def print_record(record: TrialRecord) -> None:
    model = f" ({record.model})" if record.model else ""
    header = plain(f" · agent {record.agent}{model} · backend {record.backend}")
    common.out.print(Text.assemble((terminal_safe(record.task), "bold"), header))
    table = Table()
    table.add_column("assertion")
    table.add_column("result", justify="center")
    for assertion in record.assertions:
        table.add_row(plain(assertion["name"]), "[green]pass[/]" if assertion["passed"] else "[red]FAIL[/]")
    common.out.print(table)
    verdict = "[green]resolved[/]" if record.resolved else "[red]not resolved[/]"
    common.out.print(
        Text.assemble(
            Text.from_markup(verdict),
            plain(
                f" · reward {record.reward:.3f} · {record.passed}/{record.total} assertions"
                f" ({record.report_format}) · {record.turns} turns · {record.timings.get('total', 0):.1f}s"
                + (f" · stop {record.stop_reason}" if record.stop_reason else "")
                + (f" · {record.parse_errors} parse errors" if record.parse_errors else "")
            ),
        )
    )
    print_notes(record)


def print_notes(record: TrialRecord) -> None:
    """What follows a trial's verdict: its warnings, its error and, when kept, how to enter its sandbox."""
    for warning in record.warnings:
        common.out.print(Text.assemble(("warning", "yellow"), plain(f" {warning}")))
    if record.error:
        common.out.print(
            Text.assemble(("error", "yellow"), plain(f" {record.error['kind']}: {record.error['message']}"))
        )
    if record.kept:
        print_kept(record.kept)


def print_kept(kept: dict[str, str]) -> None:
    """How to enter and remove a sandbox ``--keep`` left running (``capabilities.keep``)."""
    common.out.print(
        Text.assemble(
            ("sandbox kept", "bold"),
            plain(f": enter it with `{kept['attach']}`; remove it with `{kept['remove']}`"),
        ),
        soft_wrap=True,  # the commands stay whole, to copy
    )
