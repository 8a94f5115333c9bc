"""The command line, run as a user runs it: real processes, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from termgym.records import read_records
from tests.conftest import write_task


def termgym(*args: str, stdin: str | None = None, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "termgym", *args],
        input=stdin, capture_output=True, text=True, timeout=timeout, cwd=cwd,
    )  # fmt: skip


def one_line_error(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_check_json_prints_the_record_alone(task_dir, no_leaks):
    result = termgym("check", str(task_dir), "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    expected_keys = {"task", "backend", "agent", "resolved", "reward", "passed", "total", "assertions",
                     "report_format", "turns", "error", "timings"}  # fmt: skip
    assert expected_keys <= record.keys()
    assert record["resolved"] and record["agent"] == "oracle" and record["backend"] == "local"
    assert record["assertions"] == [{"name": "result exists", "passed": True}, {"name": "result says done", "passed": True}]
    assert record["timings"]["total"] > 0


def test_check_table_and_null_agent(task_dir, no_leaks):
    result = termgym("check", str(task_dir), "--agent", "null")
    assert result.returncode == 0
    assert "result exists" in result.stdout and "FAIL" in result.stdout and "not resolved" in result.stdout


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda t: (t / "task.toml").write_text("[agent\ntimeout_sec = 1"), "task.toml"),
        (lambda t: (t / "task.toml").write_text('[agent]\ntimeout_sec = "soon"\n'), "task.toml"),
        (lambda t: (t / "instruction.md").unlink(), "instruction.md"),
        (lambda t: (t / "tests" / "test.sh").unlink(), "test.sh"),
    ],
)
def test_invalid_task_is_one_line_and_exit_2(tmp_path, mutate, fragment):
    task_dir = write_task(tmp_path)
    mutate(task_dir)
    result = termgym("check", str(task_dir))
    assert result.returncode == 2
    assert fragment in one_line_error(result)


def test_invalid_tb1_yaml_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "task.yaml").write_text("instruction: [unclosed\n")
    result = termgym("check", str(tmp_path / "t"))
    assert result.returncode == 2 and "task.yaml" in one_line_error(result)


@pytest.mark.parametrize(
    "args",
    [["check"], ["check", "/no/such/task"], ["check", "x", "--agent", "genius"], ["frobnicate"], ["run", "x", "-n", "0"]],
)
def test_bad_usage_is_one_line_and_exit_2(args):
    result = termgym(*args)
    assert result.returncode == 2
    one_line_error(result)


def test_build_failure_exits_1_with_record(tmp_path, no_leaks):
    task_dir = write_task(tmp_path, dockerfile="FROM debian:bookworm-slim\nRUN exit 7\n")
    result = termgym("check", str(task_dir), "--json")
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"]["kind"] == "build_failed"


def test_shell_steps_interactively_and_submits(task_dir, no_leaks):
    script = "cd /tmp\npwd\necho done > /app/result.txt\nls /nope\n:submit\n"
    result = termgym("shell", str(task_dir), stdin=script)
    assert result.returncode == 0, result.stderr
    assert "/tmp\n" in result.stdout and "[exit code 2]" in result.stdout
    assert "resolved" in result.stdout and "2/2 assertions" in result.stdout


def test_shell_quit_leaves_without_verifying(task_dir, no_leaks):
    result = termgym("shell", str(task_dir), stdin="echo hi\n:quit\n")
    assert result.returncode == 0 and "hi" in result.stdout and "assertions" not in result.stdout


def test_run_writes_a_record_per_trial(tmp_path, no_leaks):
    first = write_task(tmp_path, "first")
    second = write_task(tmp_path, "second", solve_sh="#!/bin/bash\necho wrong > /app/result.txt\n")
    out = tmp_path / "run"
    result = termgym("run", str(first), str(second), "-n", "2", "-k", "2", "--out", str(out))
    assert result.returncode == 0, result.stderr
    records = read_records(out / "trials.jsonl")
    assert len(records) == 4
    by_task = {(r["task"], r["resolved"]) for r in records}
    assert by_task == {("first", True), ("second", False)}
    assert "mean reward" in result.stdout
    (metrics,) = read_records(out / "metrics.jsonl")  # one step, mode wait, every trial kept
    assert metrics["mode"] == "wait" and metrics["kept"] == 4 and metrics["families"]["tv_distance"] == 0.0
    assert "straggler bias per family" in result.stdout and "step 0 · wait · kept 4" in result.stderr


def test_run_batches_with_the_scheduler_on_a_simulated_clock(tmp_path):
    out = tmp_path / "run"
    result = termgym("run", "envs/", "--simulate", "--batch", "64", "--steps", "2", "--nodes", "2", "--node-cap", "30,40",
                     "--mode", "carry-over", "--out", str(out), cwd=Path(__file__).resolve().parents[2])  # fmt: skip
    assert result.returncode == 0, result.stderr
    steps = read_records(out / "metrics.jsonl")
    assert [m["kept"] for m in steps] == [64, 64] and steps[1]["max_staleness"] >= 1
    assert max(steps[0]["node_peaks"].values()) <= 40 and set(steps[0]["families"]["groups"]) == {"archives", "file-ops", "shell-scripting", "text-processing"}
    assert steps[1]["run"]["families"]["totals"]["kept"] == 128
    assert len(read_records(out / "trials.jsonl")) == steps[1]["run"]["families"]["totals"]["launched"]  # carried tail cancelled at the end
    assert "shell-scripting" in result.stdout and "total-variation distance" in result.stdout


@pytest.mark.parametrize(
    "args",
    [["--batch", "0"], ["--batch", "4", "--oversample", "3"], ["--nodes", "2", "--node-cap", "3,4,5"], ["--node-cap", "x"],
     ["--mode", "drop"], ["--steps", "0"]],
)  # fmt: skip
def test_bad_scheduler_options_are_one_line_and_exit_2(task_dir, args):
    result = termgym("run", str(task_dir), "--simulate", *args)
    assert result.returncode == 2
    one_line_error(result)


def test_list_shows_bundled_tasks():
    result = termgym("list")
    assert result.returncode == 0 and "file-ops/bulk-rename" in result.stdout
