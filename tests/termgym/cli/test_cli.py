"""The command line, run as a user runs it: real processes, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest
from rich.console import Console

from termgym import cli, sandboxes
from termgym.audit import runner as audit_runner
from termgym.audit.rubric import Reject, Verdict
from termgym.cli import common, episodes, runs
from termgym.records import TrialRecord, read_records
from tests.helpers import KIT_SOURCE, REPO_ROOT, termgym, write_task


def one_line_error(result: subprocess.CompletedProcess) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_check_json_prints_the_record_alone(task_dir, no_leaks):
    result = termgym("check", str(task_dir), "--json")
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout)
    expected_keys = {
        "task",
        "backend",
        "agent",
        "resolved",
        "reward",
        "passed",
        "total",
        "assertions",
        "report_format",
        "turns",
        "error",
        "timings",
    }
    assert expected_keys <= record.keys()
    assert record["resolved"] and record["agent"] == "oracle" and record["backend"] == "local"
    assert record["assertions"] == [
        {"name": "result exists", "passed": True},
        {"name": "result says done", "passed": True},
    ]
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
    [
        ["check"],
        ["check", "/no/such/task"],
        ["check", "x", "--agent", "genius"],
        ["frobnicate"],
        ["run", "x", "-n", "0"],
    ],
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
    result = termgym(
        "run",
        "envs/",
        "--simulate",
        "--batch",
        "64",
        "--steps",
        "2",
        "--nodes",
        "2",
        "--node-cap",
        "30,40",
        "--mode",
        "carry-over",
        "--out",
        str(out),
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr
    steps = read_records(out / "metrics.jsonl")
    assert [m["kept"] for m in steps] == [64, 64] and steps[1]["max_staleness"] >= 1
    assert max(steps[0]["node_peaks"].values()) <= 40 and set(steps[0]["families"]["groups"]) == {
        "archives",
        "file-ops",
        "shell-scripting",
        "text-processing",
    }
    assert steps[1]["run"]["families"]["totals"]["kept"] == 128
    assert (
        len(read_records(out / "trials.jsonl")) == steps[1]["run"]["families"]["totals"]["launched"]
    )  # carried tail cancelled at the end
    assert "shell-scripting" in result.stdout and "total-variation distance" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["--batch", "0"],
        ["--batch", "4", "--oversample", "3"],
        ["--nodes", "2", "--node-cap", "3,4,5"],
        ["--node-cap", "x"],
        ["--mode", "drop"],
        ["--steps", "0"],
    ],
)
def test_bad_scheduler_options_are_one_line_and_exit_2(task_dir, args):
    result = termgym("run", str(task_dir), "--simulate", *args)
    assert result.returncode == 2
    one_line_error(result)


def test_list_shows_bundled_tasks():
    result = termgym("list")
    assert result.returncode == 0 and "file-ops/bulk-rename" in result.stdout


# -- text from tasks, sandboxes and verifiers is printed as text, without terminal controls ---------

ESC = "\x1b"
MARKUP_NAMES_TEST_SH = textwrap.dedent(f"""\
    #!/bin/sh
    {KIT_SOURCE}
    tg_check "x[/bold]" true
    tg_check "[red]not red[/red] [/]" true
    tg_finish
    """)
# The kit drops control characters from names: this verifier writes its own report.
ESCAPE_NAMES_TEST_SH = """#!/bin/sh
mkdir -p /logs/verifier
cat > /logs/verifier/ctrf.json <<'EOF'
{"results":{"tests":[{"name":"\\u001b]0;pwned\\u0007title kept","status":"passed"},
{"name":"\\u001b]52;c;cm0gLXJmIH4=\\u0007\\u001b[2Jscreen kept\\u001b[0m","status":"passed"},
{"name":"x[/bold]\\u009b2J\\r\\b","status":"failed"}]}}
EOF
"""


@pytest.fixture
def colorless(monkeypatch):
    """Rich writes no style of its own: every ESC in the output would come from the task."""
    for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(common, "out", Console(highlight=False, width=160, color_system=None))
    monkeypatch.setattr(common, "err", Console(stderr=True, highlight=False, width=160, color_system=None))


def assert_no_terminal_controls(*texts: str) -> None:
    for text in texts:
        assert ESC not in text and "\x07" not in text and "\x9b" not in text and "\r" not in text, repr(text)
        assert "Traceback" not in text


@pytest.mark.parametrize(
    ("test_sh", "shown"),
    [
        (MARKUP_NAMES_TEST_SH, ["x[/bold]", "[red]not red[/red] [/]"]),
        (ESCAPE_NAMES_TEST_SH, ["title kept", "screen kept", "x[/bold]2J"]),
    ],
    ids=["markup", "escapes"],
)
def test_check_prints_assertion_names_as_text(tmp_path, no_leaks, colorless, test_sh, shown):
    task_dir = write_task(tmp_path, test_sh=test_sh)
    with open(task_dir / "task.toml", "a") as toml:  # a task name that is markup too
        toml.write('[task]\nname = "[/bold]evil \\u001b]0;pwned\\u0007"\n')
    result = termgym("check", str(task_dir))
    assert result.returncode == 0, result.stderr
    assert_no_terminal_controls(result.stdout, result.stderr)
    for name in shown:
        assert name in result.stdout
    assert "[/bold]evil" in result.stdout and "pwned" not in result.stdout and "cm0g" not in result.stdout


def test_shell_prints_the_sandbox_as_text(tmp_path, no_leaks, colorless):
    task_dir = write_task(tmp_path, instruction="Do [bold]this[/] \x1b]0;pwned\x07\x1b[2Jnow.")
    with open(task_dir / "task.toml", "a") as toml:
        toml.write('[task]\nname = "x[/bold]"\n')
    script = (
        "printf 'out \\033]52;c;cm0gLXJmIH4=\\007\\033[2J[/bold] done\\r\\n'\n"
        "mkdir -p \"$(printf '/tmp/d\\033[2J')\" && cd \"$(printf '/tmp/d\\033[2J')\"\n"  # the prompt shows the cwd
        "echo done > /app/result.txt\n:submit\n"
    )
    result = termgym("shell", str(task_dir), stdin=script)
    assert result.returncode == 0, result.stderr
    assert_no_terminal_controls(result.stdout, result.stderr)
    assert "x[/bold]" in result.stdout and "Do [bold]this[/] now." in result.stdout
    assert "out [/bold] done\n" in result.stdout and "/tmp/d$ " in result.stdout and "2/2 assertions" in result.stdout


def test_one_line_errors_carry_no_terminal_controls(colorless):
    result = termgym("check", "/no/such/\x1b]0;pwned\x07task\x1b[2J")
    assert result.returncode == 2
    assert_no_terminal_controls(one_line_error(result))
    assert "/no/such/task" in result.stderr


def test_records_and_summaries_print_untrusted_text_as_text(colorless, capsys):
    record = TrialRecord(task="t[/bold]\x1b]0;pwned\x07", backend="local", agent="oracle", reward=0.0)
    record.assertions = [{"name": "a[/red]\x1b[2J", "passed": False}]
    record.total, record.report_format = 1, "ctrf"
    record.error = {"kind": "verifier_error", "message": "bad [/] report\x1b]52;c;eA==\x07 [bold]x\r\n"}
    episodes.print_record(record)
    runs.print_summary([record])
    printed = capsys.readouterr()
    assert_no_terminal_controls(printed.out, printed.err)
    assert "t[/bold] · agent oracle" in printed.out and "a[/red]" in printed.out
    assert "error verifier_error: bad [/] report [bold]x" in printed.out
    assert printed.out.count("t[/bold]") == 2  # the header and the summary table


def test_audit_table_prints_untrusted_text_as_text(tmp_path, colorless, capsys, monkeypatch):
    verdict = Verdict(
        task="v[/bold]\x1b]0;pwned\x07",
        scores={},
        score=0.25,
        accepted=False,
        rejects=[Reject("test_leakage", "tests/x[/red] \x1b[2Jis in the build context")],
        checks={"oracle": "3/3", "leakage": "tests/x[/red]\x1b[2J"},
        flags=[Reject("odd\x1b[31m[/]", "why")],
    )

    async def audit_tasks(tasks, options, **kwargs):
        return [verdict]

    monkeypatch.setattr(sandboxes, "preflight", lambda backend: None)
    monkeypatch.setattr(audit_runner, "audit_tasks", audit_tasks)
    assert cli.main(["audit", str(write_task(tmp_path))]) == 0
    printed = capsys.readouterr()
    assert_no_terminal_controls(printed.out, printed.err)
    assert "v[/bold]" in printed.out and "reject test_leakage: tests/x[/red] is in the build context" in printed.out
    assert "odd[/]" in printed.out
