"""Reading a run directory: transcripts found where the run put them, a missing or broken
transcript (or a line that is not a record) noted, never fatal; bad CLI input is one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

from termgym.cli.run_report import load_report, write_report
from termgym.records import TrialRecord, append_record
from termgym.transcript import Transcript, write_transcript
from tests.termgym.cli.run_report.helpers import termgym


def make_run(root: Path) -> Path:
    run = root / "runs" / "r"
    for trial_id in ("good", "relative", "broken", "missing"):
        record = TrialRecord(task="t/x", backend="local", agent="oracle", trial_id=trial_id, family="f")
        if trial_id in ("good", "relative", "broken"):
            transcript = Transcript(task="t/x", trial_id=trial_id)
            transcript.step(f"echo {trial_id}", None, {"output": f"{trial_id}\n", "exit_code": 0}, f"{trial_id}\n")
            folder = run / "trials" / trial_id if trial_id != "relative" else root / "elsewhere" / trial_id
            path = write_transcript(folder, transcript)
            record.transcript = str(path.relative_to(root)) if trial_id == "relative" else str(path)
            if trial_id == "broken":
                path.write_text("{not json")
        append_record(run / "trials.jsonl", record)
    with open(run / "trials.jsonl", "a") as handle:
        handle.write(json.dumps({"not": "a record"}) + "\n" + "[1, 2]\n")
    return run


def test_transcripts_are_found_or_their_absence_noted(tmp_path: Path):
    run = make_run(tmp_path)
    data = load_report(run, cwd=tmp_path)
    assert [t.record["trial_id"] for t in data.trials] == ["good", "relative", "broken", "missing"]
    views = {t.record["trial_id"]: t.transcript for t in data.trials}
    assert views["good"].steps[0].command is not None and views["good"].steps[0].command.text == "echo good"
    assert views["relative"].steps[0].command is not None  # relative to the run's working directory
    assert (views["broken"].note or "").startswith("transcript unreadable: ")
    assert views["missing"].note == "no transcript for this trial"
    assert data.summary["records"] == 4  # the two lines that are not records are left out


def test_the_report_is_written_whole(tmp_path: Path):
    run = make_run(tmp_path)
    out = write_report(run, tmp_path / "deep" / "report.html")
    assert out.read_text().count('<tr class="trial"') == 4
    assert not list(out.parent.glob("*.tmp"))


def test_a_missing_run_dir_is_one_line_and_exit_2(tmp_path):
    missing = termgym("report", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.strip().splitlines() == [f"termgym: error: {tmp_path / 'nope'}: no such run directory"]
    empty = termgym("report", str(tmp_path))
    assert empty.returncode == 2 and len(empty.stderr.strip().splitlines()) == 1
    assert "no trials.jsonl" in empty.stderr
