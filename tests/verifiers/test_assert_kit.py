"""The POSIX-sh assertion kit (verifiers/kit/assert.sh), run on this machine's shells.

Checks what its header promises: every name and message, whatever its bytes, ends up as valid
UTF-8 JSON that the CTRF parser reads back; the report is valid after every assertion, so a verifier
killed half-way leaves a report of what it checked; tg_finish's exit status; nothing left behind.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from termgym.verifiers import select_report
from termgym.verifiers.ctrf import parse_ctrf
from tests.helpers import REPO_ROOT

KIT = REPO_ROOT / "verifiers" / "kit" / "assert.sh"
# dash is /bin/sh in the Debian images; bash runs the kit when a test.sh says #!/bin/bash.
SHELLS = [name for name in ("dash", "bash") if shutil.which(name)] or ["sh"]


def run_kit(shell: str, tmp_path: Path, body: str, env: dict[bytes, bytes] | None = None):
    """Run `body` after sourcing the kit, as a verifier would (LANG=C.UTF-8); returns the process
    and the report path."""
    script = tmp_path / "test.sh"
    script.write_text(f'. "$TERMGYM_ASSERT"\n{body}')
    report = tmp_path / "logs" / "verifier" / "ctrf.json"
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    environ = {
        b"PATH": os.environb.get(b"PATH", b"/usr/bin:/bin"),
        b"LANG": b"C.UTF-8",
        b"TERMGYM_ASSERT": bytes(KIT),
        b"TG_REPORT": bytes(report),
        b"TMPDIR": bytes(tmp),
        **(env or {}),
    }
    proc = subprocess.run([shell, str(script)], env=environ, capture_output=True, timeout=60, cwd=tmp_path)
    return proc, report


def expected_text(data: bytes) -> str:
    """The kit's documented mapping: invalid UTF-8 dropped, tab/LF/CR to spaces, other C0 dropped."""
    text = data.decode("utf-8", errors="ignore").translate({9: " ", 10: " ", 13: " "})
    return "".join(c for c in text if ord(c) >= 32)


TRICKY = [
    b"plain name",
    b'says "hi"',
    b"back\\slash \\\\ and \\n literally",
    b'"\\"',
    b"tab\there\nnewline\r\ncrlf",
    b"ctl \x01\x02\x1b[31mred\x1b[0m \x1f\x7f end",
    "ünïcødé ✓ 𝄞 日本語".encode(),
    b"invalid \xff\xfe \xc3( \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 cut\xe2",
    'mixed "q" é\t\\ \x01 ✓'.encode() + b"\x80",
    b"%s %d %% \\x41 $HOME `id` $(id) '",
    bytes(range(1, 256)),
]


@pytest.mark.parametrize("shell", SHELLS)
def test_any_bytes_become_valid_json(shell, tmp_path):
    rng = random.Random(7)
    fuzz = [bytes(rng.randrange(1, 256) for _ in range(rng.randrange(1, 40))) for _ in range(20)]
    values = TRICKY + fuzz
    env = {b"V%d" % i: value for i, value in enumerate(values)}
    body = "".join(f'tg_skip "$V{i}" "$V{len(values) - 1 - i}"\n' for i in range(len(values))) + "tg_finish\n"
    proc, report = run_kit(shell, tmp_path, body, env)
    assert proc.returncode == 0, proc.stderr
    data = report.read_bytes()
    tests = json.loads(data.decode("utf-8"))["results"]["tests"]  # strict UTF-8, strict JSON
    assert [(t["name"], t["message"]) for t in tests] == [
        (expected_text(values[i]), expected_text(values[len(values) - 1 - i])) for i in range(len(values))
    ]
    graded = select_report({"ctrf.json": data}, "", 0)
    assert graded.error is None and len(graded.assertions) == len(values)


@pytest.mark.parametrize("shell", SHELLS)
def test_failure_message_is_the_output_tail_even_when_binary(shell, tmp_path):
    body = r"""
tg_check "quiet failure" false
tg_check_sh "chatty failure" 'seq 1 20; printf "\n\n"; exit 3'
tg_check_sh "long line cut inside a character" 'printf "x"; i=0; while [ $i -lt 200 ]; do printf "é"; i=$((i+1)); done; exit 1'
tg_check_sh "binary output" 'printf "\377\376\000\001bin\"ary\"\n"; exit 4'
tg_check "passes" true
tg_finish
"""
    proc, report = run_kit(shell, tmp_path, body)
    assert proc.returncode == 1
    got = [(a.name, a.status, a.message) for a in parse_ctrf(report.read_bytes().decode("utf-8")).assertions]
    assert got == [
        ("quiet failure", "failed", "exit 1: "),
        ("chatty failure", "failed", "exit 3: 18 19 20"),  # the last 5 lines, blank ones included
        ("long line cut inside a character", "failed", "exit 1: x" + "é" * 149),  # 300 bytes, the last one dropped
        ("binary output", "failed", 'exit 4: bin"ary"'),
        ("passes", "passed", ""),
    ]
    assert b"FAILED  chatty failure" in proc.stdout and b"1 passed, 4 failed, 0 skipped" in proc.stdout


@pytest.mark.parametrize("shell", SHELLS)
def test_report_is_valid_after_every_assertion_and_when_killed(shell, tmp_path):
    # Each check copies the report as it stands before the check is recorded; the last one kills
    # the verifier, which must leave the report of the assertions before it.
    snap = tmp_path / "snap"
    snap.mkdir()
    body = (
        "".join(
            f'tg_check_sh "check {i} \\"q\\" é" \'cp "$TG_REPORT" {snap}/{i}.json; [ {i} -ne 2 ]\'\n' for i in range(5)
        )
        + "tg_skip skipped why\n"
        + f"tg_check_sh killer 'cp \"$TG_REPORT\" {snap}/6.json; kill -9 $PPID'\ntg_finish\n"
    )
    proc, _report = run_kit(shell, tmp_path, body, {b"TG_REPORT": bytes(tmp_path / "ctrf.json")})
    assert proc.returncode == -9
    for i in [0, 1, 2, 3, 4, 6]:
        seen = parse_ctrf((snap / f"{i}.json").read_bytes().decode("utf-8")).assertions
        assert len(seen) == i
    final = parse_ctrf((tmp_path / "ctrf.json").read_bytes().decode("utf-8")).assertions
    assert [(a.name, a.status) for a in final] == [
        ('check 0 "q" é', "passed"),
        ('check 1 "q" é', "passed"),
        ('check 2 "q" é', "failed"),
        ('check 3 "q" é', "passed"),
        ('check 4 "q" é', "passed"),
        ("skipped", "skipped"),
    ]
    summary = json.loads((tmp_path / "ctrf.json").read_text())["results"]["summary"]
    assert (summary["tests"], summary["passed"], summary["failed"], summary["skipped"]) == (6, 4, 1, 1)


@pytest.mark.parametrize("shell", SHELLS)
def test_a_timeouts_term_waits_for_the_running_check_and_leaves_the_report_whole(shell, tmp_path):
    # The TERM comes while a check runs (as the verifier's timeout sends it): the kit's trap ends the
    # shell once that check returns (exit 143, not death by the signal mid-rewrite), and the report
    # holds every assertion recorded before it.
    body = "tg_check first true\ntg_check_sh second 'kill -TERM $PPID; sleep 0.3'\ntg_check never true\ntg_finish\n"
    proc, report = run_kit(shell, tmp_path, body)
    assert proc.returncode == 143, (proc.returncode, proc.stderr)
    final = parse_ctrf(report.read_text())
    assert [(a.name, a.status) for a in final.assertions] == [("first", "passed")]
    assert sorted(p.name for p in report.parent.iterdir()) == ["ctrf.json"]


@pytest.mark.parametrize("shell", SHELLS)
def test_finish_exit_status_summary_and_cleanup(shell, tmp_path):
    proc, report = run_kit(shell, tmp_path, "set -eu\ntg_check ok true\ntg_skip later 'not yet'\ntg_finish\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.decode().splitlines() == [
        "ok      ok",
        "skipped later (not yet)",
        "1 passed, 0 failed, 1 skipped",
    ]
    data = json.loads(report.read_text())
    summary = data["results"]["summary"]
    assert data["results"]["tool"] == {"name": "termgym-assert"}
    assert (summary["tests"], summary["passed"], summary["failed"], summary["skipped"]) == (2, 1, 0, 1)
    assert isinstance(summary["start"], int) and summary["stop"] >= summary["start"] > 0
    assert sorted(p.name for p in report.parent.iterdir()) == ["ctrf.json"]  # no .tmp left
    assert list((tmp_path / "tmp").iterdir()) == []  # scratch files removed

    proc, report = run_kit(shell, tmp_path, "set -eu\ntg_check bad false\ntg_finish\n")
    assert proc.returncode == 1 and json.loads(report.read_text())["results"]["summary"]["failed"] == 1


@pytest.mark.parametrize("shell", SHELLS)
def test_empty_report_written_on_source_and_checks_run_isolated(shell, tmp_path):
    # Sourcing alone leaves a valid empty report; a check gets stdin from /dev/null; a command
    # that is not there is a failure, not an error of the verifier.
    body = """cp "$TG_REPORT" empty.json
tg_check_sh "stdin is empty" '[ -z "$(cat)" ]'
tg_check "missing command" no-such-command-xyz
tg_finish
"""
    proc, report = run_kit(shell, tmp_path, body)
    assert proc.returncode == 1
    assert parse_ctrf((tmp_path / "empty.json").read_text()).assertions == ()
    got = [(a.name, a.status) for a in parse_ctrf(report.read_text()).assertions]
    assert got == [("stdin is empty", "passed"), ("missing command", "failed")]


def fake_date(tmp_path: Path, script: str) -> bytes:
    """A PATH whose first ``date`` is ``script`` (sh), made or replaced under ``tmp_path``."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    (fake / "date").write_text(f"#!/bin/sh\n{script}\n")
    (fake / "date").chmod(0o755)
    return bytes(fake) + b":" + os.environb.get(b"PATH", b"/usr/bin:/bin")


def test_clock_without_milliseconds_still_gives_valid_json(tmp_path):
    # busybox date prints %3N literally: the kit keeps the seconds, never writes invalid JSON; with
    # no date at all, 0.
    path = fake_date(tmp_path, "echo 1700000000%3N")
    proc, report = run_kit(SHELLS[0], tmp_path, "tg_check ok true\ntg_finish\n", {b"PATH": path})
    assert proc.returncode == 0
    summary = json.loads(report.read_text())["results"]["summary"]
    assert summary["start"] == 1700000000000 and summary["stop"] == 1700000000000
    path = fake_date(tmp_path, "exit 1")
    proc, report = run_kit(SHELLS[0], tmp_path, "tg_check ok true\ntg_finish\n", {b"PATH": path})
    assert proc.returncode == 0
    summary = json.loads(report.read_text())["results"]["summary"]
    assert summary["start"] == 0 and summary["stop"] == 0


@pytest.mark.skipif(not shutil.which("bash"), reason="bash's clock")
def test_under_bash_the_clock_is_its_own_not_a_date_process(tmp_path):
    """bash 5's EPOCHREALTIME tells the time without a process: a ``date`` that fails changes nothing."""
    path = fake_date(tmp_path, "exit 1")
    before = int(time.time() * 1000)
    proc, report = run_kit("bash", tmp_path, "tg_check ok true\nsleep 0.05\ntg_finish\n", {b"PATH": path})
    after = int(time.time() * 1000)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(report.read_text())["results"]["summary"]
    assert before - 1 <= summary["start"] <= summary["stop"] - 50 and summary["stop"] <= after + 1, (before, after)


@pytest.mark.parametrize("shell", SHELLS)
def test_relative_report_path(shell, tmp_path):
    proc, _ = run_kit(shell, tmp_path, "tg_check ok true\ntg_finish\n", {b"TG_REPORT": b"ctrf.json"})
    assert proc.returncode == 0, proc.stderr
    assert [a.name for a in parse_ctrf((tmp_path / "ctrf.json").read_text()).assertions] == ["ok"]


@pytest.mark.parametrize("shell", SHELLS)
def test_long_names_and_messages_are_cut_at_4096_bytes(shell, tmp_path):
    # Escaping in the shell is quadratic in a string's specials, so the kit cuts first; a 100 KB
    # reason full of quotes stays quick and valid.
    long_name = b"n" * 5000
    long_reason = ('"é\\\t' * 20000).encode()
    env = {b"NAME": long_name, b"REASON": long_reason}
    proc, report = run_kit(shell, tmp_path, 'tg_skip "$NAME" "$REASON"\ntg_check_sh "$REASON" true\ntg_finish\n', env)
    assert proc.returncode == 0, proc.stderr
    tests = json.loads(report.read_bytes().decode("utf-8"))["results"]["tests"]
    assert tests[0]["name"] == "n" * 4096
    assert tests[0]["message"] == expected_text(long_reason[:4096]) == tests[1]["name"]


def failing_tools(tmp_path: Path) -> bytes:
    """A PATH whose ``mktemp`` fails and whose ``date`` says 1700000000123 (ms since the epoch)."""
    path = fake_date(tmp_path, "echo 1700000000123")
    (tmp_path / "bin" / "mktemp").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "bin" / "mktemp").chmod(0o755)
    return path


@pytest.mark.parametrize("shell", SHELLS)
def test_a_harness_scratch_directory_and_start_time_replace_mktemp_and_the_clock(shell, tmp_path):
    # With TG_SCRATCH and TG_START_MS the kit forks neither mktemp nor (at source) date: both are
    # broken here and the verifier still runs; the scratch directory is the harness's to keep.
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = {b"PATH": failing_tools(tmp_path), b"TG_SCRATCH": bytes(scratch), b"TG_START_MS": b"1699999999000"}
    proc, report = run_kit(shell, tmp_path, "tg_check ok true\ntg_check bad sh -c 'echo why; exit 3'\ntg_finish\n", env)
    assert proc.returncode == 1, proc.stderr
    data = json.loads(report.read_text())["results"]
    assert (data["summary"]["start"], data["summary"]["passed"], data["summary"]["failed"]) == (1699999999000, 1, 1)
    assert data["tests"][1]["message"] == "exit 3: why"
    if shell != "bash":  # bash reads its own clock
        assert data["summary"]["stop"] == 1700000000123
    assert scratch.is_dir() and (scratch / "out").exists()  # used, and left in place


@pytest.mark.parametrize("shell", SHELLS)
def test_a_scratch_that_is_no_directory_of_its_own_is_not_used(shell, tmp_path):
    # A symlink, a file or a missing path: the kit makes its own (here mktemp fails, so it says so).
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    (tmp_path / "file").write_text("")
    for scratch in (tmp_path / "link", tmp_path / "file", tmp_path / "missing"):
        env = {b"PATH": failing_tools(tmp_path), b"TG_SCRATCH": bytes(scratch), b"TG_START_MS": b"1"}
        proc, _ = run_kit(shell, tmp_path, "tg_check ok true\ntg_finish\n", env)
        assert proc.returncode == 1 and b"cannot create a scratch directory" in proc.stderr, (scratch, proc.stderr)
    assert list((tmp_path / "real").iterdir()) == []


@pytest.mark.parametrize("shell", SHELLS)
def test_a_start_time_that_is_not_a_number_is_the_clocks(shell, tmp_path):
    env = {b"PATH": failing_tools(tmp_path), b"TMPDIR": bytes(tmp_path), b"TG_START_MS": b"12; rm -rf /"}
    (tmp_path / "bin" / "mktemp").unlink()  # the system's
    proc, report = run_kit(shell, tmp_path, "tg_finish\n", env)
    assert proc.returncode == 0, proc.stderr
    start = json.loads(report.read_text())["results"]["summary"]["start"]
    assert start == 1700000000123 if shell != "bash" else start > 1700000000123
