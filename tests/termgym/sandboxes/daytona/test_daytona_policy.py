"""The Daytona backend's pure decisions, as tables: retry classes, retry-after, backoff, snapshot
names, resources, and the command encoding (run through real shells)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from termgym.sandboxes.daytona.policy import (
    ContextEntry,
    RetryPolicy,
    backoff_delay,
    classify_failure,
    command_line,
    daytona_resources,
    encode_command,
    environment_hash,
    exec_script,
    is_quota_message,
    paced_windows,
    parse_exec_output,
    retry_after_seconds,
    retry_delay,
    snapshot_name,
)
from termgym.sandboxes.daytona.provider import DaytonaSettings
from termgym.sandboxes.pacing import Window, max_in_any_window
from termgym.tasks import Resources


@pytest.mark.parametrize(
    ("status", "message", "transport", "expected"),
    [
        (429, "ThrottlerException: Too Many Requests", False, "rate_limited"),
        (400, "Total CPU limit exceeded. Maximum allowed: 10.", False, "quota"),
        (400, "Total memory limit exceeded. Maximum allowed: 20GiB", False, "quota"),
        (400, "Sandbox resource limit reached (16), please try again later", False, "quota"),
        (400, "Request exceeds the disk quota of the organization", False, "quota"),
        (400, "labels must be an object", False, "fatal"),
        (400, "Snapshot termgym-abc not found", False, "fatal"),
        (403, "Total CPU limit exceeded", False, "fatal"),  # only a 400 is a quota error
        (500, "Internal server error", False, "transient"),
        (502, "Bad gateway", False, "transient"),
        (503, "Service unavailable", False, "transient"),
        (504, "Gateway timeout", False, "transient"),
        (None, "Connection refused", True, "transient"),
        (None, "Sandbox entered error state", False, "fatal"),
        (401, "Invalid credentials", False, "fatal"),
        (404, "not found", False, "fatal"),
        (409, "already exists", False, "fatal"),
    ],
)
def test_classify_failure(status, message, transport, expected):
    assert classify_failure(status, message, transport=transport) == expected


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("Total GPU limit exceeded", True),
        ("quota exceeded", True),
        ("limits reached for org", True),
        ("", False),
        ("bad limit value", False),
    ],
)
def test_is_quota_message(message, expected):
    assert is_quota_message(message) is expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        (None, None),
        ({"Retry-After": "3"}, 3.0),
        ({"retry-after-sandbox-create": "2.5"}, 2.5),
        ({"Retry-After-sandbox-create": "7", "Retry-After-authenticated": "1"}, 7.0),  # the longest wins
        ({"X-RateLimit-Reset-sandbox-create": "12"}, 12.0),  # used only without retry-after
        ({"X-RateLimit-Reset-sandbox-create": "12", "Retry-After": "2"}, 2.0),
        ({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, None),
        ({"Retry-After": "-1"}, None),
        ({"Retry-After": "nan"}, None),
        ({"Content-Type": "application/json"}, None),
    ],
)
def test_retry_after_seconds(headers, expected):
    assert retry_after_seconds(headers) == expected


@pytest.mark.parametrize(
    ("attempt", "retry_after", "draw", "expected"),
    [
        (1, None, 0.0, 1.0),
        (2, None, 0.0, 2.0),
        (3, None, 0.0, 4.0),
        (10, None, 0.0, 30.0),  # capped
        (1, 5.0, 0.0, 5.0),  # never below the server's retry-after
        (10, 45.0, 0.0, 45.0),  # a retry-after above the cap wins
        (1, None, 0.5, 1.25),  # jitter 0.5 at draw 0.5: +25%
        (3, 2.0, 0.999, 4.0 * (1 + 0.5 * 0.999)),
    ],
)
def test_backoff_delay(attempt, retry_after, draw, expected):
    assert backoff_delay(attempt, base=1.0, cap=30.0, retry_after=retry_after, jitter=0.5, draw=draw) == pytest.approx(
        expected
    )


@pytest.mark.parametrize(
    ("attempt", "draw", "message"),
    [
        (0, 0.0, "attempt numbers start at 1, got 0"),
        (1, 1.0, "draw must be in [0, 1), got 1.0"),
        (1, -0.1, "draw must be in [0, 1), got -0.1"),
    ],
)
def test_backoff_delay_rejects_bad_input(attempt, draw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        backoff_delay(attempt, base=1.0, cap=2.0, retry_after=None, jitter=0.5, draw=draw)


POLICY = RetryPolicy(
    rate_limited_attempts=4,
    quota_attempts=3,
    transient_attempts=2,
    base_delay=1.0,
    max_delay=8.0,
    quota_base_delay=5.0,
    quota_max_delay=20.0,
    jitter=0.0,
)


@pytest.mark.parametrize(
    ("kind", "attempt", "retry_after", "expected"),
    [
        ("fatal", 1, None, None),
        ("transient", 1, None, 1.0),
        ("transient", 2, None, None),  # 2 attempts in all
        ("rate_limited", 1, 3.0, 3.0),
        ("rate_limited", 3, None, 4.0),
        ("rate_limited", 4, None, None),
        ("quota", 1, None, 5.0),
        ("quota", 2, None, 10.0),
        ("quota", 3, None, None),
    ],
)
def test_retry_delay(kind, attempt, retry_after, expected):
    assert retry_delay(POLICY, kind, attempt, retry_after, 0.0) == expected


def test_retry_delays_stay_within_bounds_for_any_draw():
    for attempt in range(1, 60):
        for draw in (0.0, 0.3, 0.999):
            delay = retry_delay(RetryPolicy(), "rate_limited", attempt, 2.0, draw)
            assert delay is not None and 2.0 <= delay <= 30.0 * 1.5


def test_retry_policy_rejects_nonsense():
    with pytest.raises(ValueError, match="retry attempts must be at least 1"):
        RetryPolicy(transient_attempts=0)
    with pytest.raises(ValueError, match="retry delays must satisfy 0 <= base_delay <= max_delay and jitter >= 0"):
        RetryPolicy(base_delay=5.0, max_delay=1.0)


ENTRIES = [ContextEntry("layout.txt", b"a\n"), ContextEntry("bin/run.sh", b"#!/bin/sh\n", executable=True)]


@pytest.mark.parametrize(
    ("changed", "same"),
    [
        ((b"FROM debian\nRUN true\n", ENTRIES, None, (1, 2, 10)), False),  # Dockerfile
        ((b"FROM debian\n", ENTRIES[:1], None, (1, 2, 10)), False),  # a context file removed
        ((b"FROM debian\n", [ENTRIES[0], ContextEntry("bin/run.sh", b"#!/bin/sh\n")], None, (1, 2, 10)), False),  # mode
        ((b"FROM debian\n", [ENTRIES[0], ContextEntry("bin/run.sh", b"#!/bin/bash\n", True)], None, (1, 2, 10)), False),
        ((b"FROM debian\n", ENTRIES, "debian:12", (1, 2, 10)), False),  # image
        ((b"FROM debian\n", ENTRIES, None, (2, 2, 10)), False),  # resources
        ((b"FROM debian\n", list(reversed(ENTRIES)), None, (1, 2, 10)), True),  # order does not matter
    ],
)
def test_environment_hash_follows_content(changed, same):
    base = environment_hash(b"FROM debian\n", ENTRIES, None, (1, 2, 10))
    assert (environment_hash(*changed) == base) is same


def test_environment_hash_does_not_confuse_boundaries():
    one = environment_hash(b"x", [ContextEntry("ab", b"c")], None, (1, 1, 1))
    two = environment_hash(b"x", [ContextEntry("a", b"bc")], None, (1, 1, 1))
    assert one != two


def test_snapshot_name():
    digest = environment_hash(b"FROM debian\n", [], None, (1, 1, 1))
    assert snapshot_name(digest) == f"termgym-{digest[:12]}"
    with pytest.raises(ValueError, match="not a hex digest: 'not hex'"):
        snapshot_name("not hex")


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (Resources(), (1, 2, 10)),
        (Resources(cpus=0.5, memory_mb=512, storage_mb=1000), (1, 1, 1)),
        (Resources(cpus=1.5, memory_mb=1025, storage_mb=3072), (2, 2, 3)),
        (Resources(cpus=4, memory_mb=8192, storage_mb=10240), (4, 8, 10)),
    ],
)
def test_daytona_resources(resources, expected):
    assert daytona_resources(resources) == expected


SHELLS = [shell for shell in ("sh", "dash", "bash") if shutil.which(shell)]
SCRIPTS = [
    "echo plain",
    "printf '%s|' \"it's\" 'a \"quote\"' '$HOME' '`x`' '\\n'",
    "x=1; if [ $x -eq 1 ]; then echo one; fi\necho second line",
    "printf '%s' 'percent %d and 100%'",
    "echo 'ünïcödé ✓'",
    "printf 'tab\\there'",
]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("script", SCRIPTS)
def test_encode_command_runs_the_script_unchanged(shell, script):
    encoded = encode_command(script)
    assert all(c.isascii() for c in encoded)
    inner = encoded.removeprefix("/bin/sh -c '").removesuffix("'")
    assert "'" not in inner  # one single-quoted word: survives a naive quote splitter
    expected = subprocess.run([shell, "-c", script], capture_output=True)
    got = subprocess.run([shell, "-c", inner], capture_output=True)
    assert got.stdout == expected.stdout and got.returncode == expected.returncode


def test_encode_command_rejects_nul():
    with pytest.raises(ValueError, match="a shell script cannot contain NUL bytes"):
        encode_command("echo \0")


def test_command_line_sets_exactly_the_environment_and_directory(tmp_path):
    line = command_line(["env"], {"A": "x y", "B": "it's", "PATH": "/usr/bin:/bin"}, str(tmp_path))
    result = subprocess.run(
        ["sh", "-c", line + "; echo cd-failed"],
        capture_output=True,
        text=True,
        env={"LEAK": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.stdout.splitlines() == ["A=x y", "B=it's", "PATH=/usr/bin:/bin"]  # exec: nothing after runs
    where = subprocess.run(["sh", "-c", command_line(["pwd"], {}, str(tmp_path))], capture_output=True, text=True)
    assert where.stdout.strip() == str(tmp_path)


@pytest.mark.parametrize("bad", [{"": "x"}, {"A=B": "x"}])
def test_command_line_rejects_bad_names(bad):
    (name,) = bad
    with pytest.raises(ValueError, match=f"invalid environment variable name {name!r}"):
        command_line(["true"], bad, "/")


@pytest.mark.parametrize(
    ("command", "limit", "code", "kept", "dropped"),
    [
        ("printf abc", 100, 0, b"abc", 0),
        ("printf abc; exit 3", 100, 3, b"abc", 0),
        ("printf 0123456789", 10, 0, b"0123456789", 0),
        ("printf 0123456789ABCDEF", 10, 0, b"01234BCDEF", 6),
        ("echo err >&2", 100, 0, b"err\n", 0),
        ("cat", 100, 0, b"from stdin", 0),
    ],
)
def test_exec_script_caps_output_in_the_sandbox(tmp_path, command, limit, code, kept, dropped):
    stdin = tmp_path / "stdin"
    stdin.write_bytes(b"from stdin")
    script = exec_script(
        ["sh", "-c", command],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        timeout=10,
        output_limit=limit,
        stdin_path=str(stdin),
    )
    result = subprocess.run(encode_command(script), shell=True, capture_output=True)
    assert result.returncode == code
    assert parse_exec_output(result.stdout.decode(), limit) == (kept, dropped)
    assert not stdin.exists()  # the uploaded stdin is removed afterwards


def test_exec_script_kills_at_the_timeout():
    script = exec_script(
        ["sh", "-c", "sleep 100 & sleep 100"],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        timeout=0.3,
        output_limit=100,
        stdin_path=None,
    )
    result = subprocess.run(encode_command(script), shell=True, capture_output=True, timeout=10)
    assert result.returncode == 124


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("3\nabc", 10, (b"abc", 0)),
        ("20\n0123456789", 10, (b"0123456789", 10)),
        ("sh: mktemp: not found\n", 100, (b"sh: mktemp: not found\n", 0)),  # no byte count: kept as is
        ("no count and too long", 4, (b"nong", 17)),
    ],
)
def test_parse_exec_output(text, limit, expected):
    assert parse_exec_output(text, limit) == expected


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, DaytonaSettings()),
        (
            {"TERMGYM_DAYTONA_PER_SECOND": "3", "TERMGYM_DAYTONA_PER_MINUTE": "100"},
            DaytonaSettings(per_second=3, per_minute=100),
        ),
        (
            {"TERMGYM_DAYTONA_CREATE_TIMEOUT": "2.5", "TERMGYM_DAYTONA_MAX_SANDBOXES": "7"},
            DaytonaSettings(create_timeout=2.5, max_sandboxes=7),
        ),
    ],
)
def test_settings_from_env(environ, expected):
    assert DaytonaSettings.from_env(environ) == expected


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"TERMGYM_DAYTONA_PER_SECOND": "six"}, "TERMGYM_DAYTONA_PER_SECOND must be a number, got 'six'"),
        ({"TERMGYM_DAYTONA_PER_SECOND": "0"}, "daytona pacing and limits must be at least 1"),
        ({"TERMGYM_DAYTONA_TTL_MINUTES": "0"}, "daytona timeouts must be positive"),
    ],
)
def test_settings_reject_bad_values(environ, message):
    with pytest.raises(ValueError, match=message):
        DaytonaSettings.from_env(environ)


@pytest.mark.parametrize(
    ("per_second", "per_minute", "guard", "expected"),
    [
        (6, 600, 0.0, (Window(1, 1 / 6), Window(6, 1.0), Window(600, 60.0))),
        (6, 600, 0.04, (Window(1, 1.04 / 6), Window(6, 1.04), Window(600, 60.04))),
        (3, 100, 0.5, (Window(1, 0.5), Window(3, 1.5), Window(100, 60.5))),
    ],
)
def test_paced_windows(per_second, per_minute, guard, expected):
    assert paced_windows(per_second, per_minute, guard) == expected


def test_paced_windows_absorb_jitter_between_grant_and_arrival():
    """Grants paced with the guard stay within the provider's exact windows even when each request
    reaches the API up to the guard later than its grant, in any pattern."""
    import random

    from termgym.sandboxes.pacing import next_grant_time

    windows = paced_windows(6, 600, 0.04)
    rng = random.Random(3)
    grants: list[float] = []
    now = 0.0
    for _ in range(2000):
        now = next_grant_time(grants, windows, now)
        grants.append(now)
    arrivals = [t + rng.uniform(0.0, 0.039) for t in grants]
    assert max_in_any_window(arrivals, 1.0) <= 6 and max_in_any_window(arrivals, 60.0) <= 600
    unguarded: list[float] = []
    now = 0.0
    for _ in range(200):
        now = next_grant_time(unguarded, paced_windows(6, 600, 0.0), now)
        unguarded.append(now)
    assert max_in_any_window([t + rng.uniform(0.0, 0.039) for t in unguarded], 1.0) > 6  # why the guard exists
