"""A run's report: one self-contained HTML file from a run directory (``termgym run``'s output).

``write_report`` is the only function here that does I/O: it reads ``RUN/trials.jsonl``, each
trial's transcript (``data.transcript_candidates``: the run's own ``trials/<id>/`` first), builds
the report's data (``termgym.cli.run_report.data``, pure) and renders it (``termgym.cli.run_report.html``, pure).
Transcripts are read one at a time and cut to the report's caps at once, so a run of 10,000 trials
never holds every transcript in memory. A transcript that is missing or unreadable is noted in
its trial, never an error: the report is still written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from termgym.cli.run_report.data import ReportData, caps_for, report_data, transcript_candidates, trial_view
from termgym.cli.run_report.html import render
from termgym.records import read_records
from termgym.transcript import read_transcript

__all__ = ["RECORDS_FILE", "ReportData", "load_report", "render", "write_report"]

RECORDS_FILE = "trials.jsonl"


def load_transcript(record: dict[str, Any], run_dir: Path, cwd: Path) -> dict[str, Any] | str | None:
    """The trial's transcript; a one-line reason when it exists but cannot be read; None when
    there is none."""
    for path in transcript_candidates(record, run_dir, cwd):
        if path.is_file():
            try:
                return read_transcript(path)
            except (OSError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
                return f"transcript unreadable: {path}: {exc}"
    return None


def load_report(run_dir: Path, cwd: Path | None = None) -> ReportData:
    """The report's data for ``run_dir`` (which must hold ``trials.jsonl``); relative transcript
    paths are tried from ``cwd`` (default: the current directory)."""
    # a line that is not a trial record (no task) is left out, as the summary could not count it
    records = [r for r in read_records(run_dir / RECORDS_FILE) if isinstance(r, dict) and r.get("task")]
    caps = caps_for(len(records))
    here = cwd or Path.cwd()
    trials = [trial_view(i, r, load_transcript(r, run_dir, here), caps) for i, r in enumerate(records)]
    return report_data(run_dir.resolve().name, records, trials)


def write_report(run_dir: Path, out: Path) -> Path:
    """Write the report of ``run_dir`` to ``out`` (whole: a temporary name, then renamed) and
    return ``out``."""
    page = render(load_report(run_dir))
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = out.with_name(out.name + ".tmp")
    scratch.write_text(page, encoding="utf-8")
    os.replace(scratch, out)
    return out
