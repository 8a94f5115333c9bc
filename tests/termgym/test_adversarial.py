"""Agents and verifiers that misbehave: each attack must end in a record, within bounds, with
nothing left running and nothing planted counted."""

from __future__ import annotations

import resource
import textwrap
import time

import pytest

from termgym.agents import OracleAgent, ScriptedAgent
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import KIT_SOURCE, pids_matching, write_task

ALL_PASS_CTRF = '{"results":{"tests":[{"name":"a","status":"passed"},{"name":"b","status":"passed"},{"name":"c","status":"passed"}]}}'


async def trial(task_dir, backend, *commands, **options):
    return await run_trial(load_task(task_dir), ScriptedAgent(tuple(commands)), EnvOptions(backend=backend, **options))


async def test_output_flood_keeps_memory_bounded(task_dir, backend, no_leaks):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.monotonic()
    record = await trial(task_dir, backend, "head -c 50000000 /dev/zero | tr '\\0' x", "echo done > /app/result.txt")
    assert record.resolved and record.error is None and record.turns == 2
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 64, f"harness memory grew {grown_mib:.0f} MiB for 50 MB of output"
    assert time.monotonic() - started < 60


async def test_binary_output_does_not_break_the_trial(task_dir, backend, no_leaks):
    record = await trial(
        task_dir, backend, "head -c 2000000 /dev/urandom", "printf '\\x00\\xff\\xfe'", "echo done > result.txt"
    )
    assert record.resolved and record.error is None


async def test_hang_past_agent_timeout_is_bounded_and_recorded(task_dir, backend, no_leaks):
    started = time.monotonic()
    record = await trial(task_dir, backend, "echo done > result.txt", "sleep 100001", agent_timeout=2.0)
    elapsed = time.monotonic() - started - record.timings["setup"]  # the bound covers agent and verifier
    assert record.error and record.error["kind"] == "agent_timeout"
    assert record.resolved  # verified on the state left behind
    assert elapsed < 2.0 + 10, f"trial took {elapsed:.1f}s after set-up for a 2s agent timeout"
    assert not pids_matching("sleep 100001")


async def test_background_processes_do_not_outlive_the_trial(task_dir, backend, no_leaks):
    record = await trial(
        task_dir,
        backend,
        "sleep 100002 &",
        "(setsid sleep 100003 &)",
        "nohup sleep 100004 >/dev/null 2>&1 &",
        "sh -c 'trap \"\" TERM HUP; exec sleep 100005' &",
    )
    assert record.error is None
    for marker in ("100002", "100003", "100004", "100005"):
        assert not pids_matching(f"sleep {marker}"), f"sleep {marker} still running"


async def test_planted_reports_do_not_count(task_dir, backend, no_leaks):
    record = await trial(
        task_dir,
        backend,
        f"mkdir -p /logs/verifier && echo '{ALL_PASS_CTRF}' > /logs/verifier/ctrf.json",
        "echo 1 > /logs/verifier/reward.txt",
        "printf '#!/bin/sh\\nexit 0\\n' > /tests/test.sh; chmod +x /tests/test.sh",
    )
    assert not record.resolved and record.passed == 0 and record.total == 2


async def test_tests_replaced_by_symlink_do_not_count(task_dir, backend, no_leaks):
    record = await trial(task_dir, backend, "rm -rf /tests/* && mkdir -p /tmp/fake && ln -s /tmp/fake /tests/fake")
    assert record.total == 2 and not record.resolved


async def test_background_rewriter_of_reports_does_not_count(task_dir, backend, no_leaks):
    rewriter = (
        f"while true; do mkdir -p /logs/verifier; echo '{ALL_PASS_CTRF}' > /logs/verifier/ctrf.json; sleep 0.01; done"
    )
    record = await trial(task_dir, backend, f'nohup sh -c "{rewriter}" >/dev/null 2>&1 &', "sleep 0.3")
    assert record.total == 2 and record.passed == 0 and not record.resolved


@pytest.mark.parametrize(
    ("test_sh", "kind", "fragment"),
    [
        ("#!/bin/sh\nexec /no/such/interpreter\n", "verifier_error", "127"),
        ("#!/bin/sh\nsleep 100006\n", "verifier_timeout", "exceeded"),
        ("#!/bin/sh\nhead -c 3000 /dev/urandom > /logs/verifier/ctrf.json\n", "verifier_error", "unparseable"),
        (
            '#!/bin/sh\nprintf \'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaa">]><x>&a;</x>\' > /logs/verifier/r.xml\n',
            "verifier_error",
            "unparseable",
        ),
    ],
)
async def test_broken_verifiers_give_a_record_not_a_crash(tmp_path, backend, no_leaks, test_sh, kind, fragment):
    task_dir = write_task(tmp_path, test_sh=test_sh, verifier_timeout=2.0)
    started = time.monotonic()
    record = await run_trial(load_task(task_dir), OracleAgent(), EnvOptions(backend=backend))
    assert record.error is not None and record.error["kind"] == kind
    assert fragment in record.error["message"]
    assert record.reward == 0.0 and not record.resolved
    assert time.monotonic() - started < 20
    assert not pids_matching("sleep 100006")


async def test_failed_build_is_a_record_with_the_log(tmp_path, no_leaks):
    dockerfile = (
        "FROM debian:bookworm-slim\nWORKDIR /app\nRUN echo building && apt-get install -y cowsay-nonexistent-tool\n"
    )
    task_dir = write_task(tmp_path, dockerfile=dockerfile)
    record = await run_trial(load_task(task_dir), OracleAgent(), EnvOptions())
    assert record.error is not None, record
    assert record.error["kind"] == "build_failed"
    assert "--backend docker" in record.error["message"]
    assert "Dockerfile:3: RUN" in record.error["message"]
    assert "building" in record.logs["build"]


async def test_verifier_sees_clean_environment(tmp_path, backend, no_leaks):
    test_sh = textwrap.dedent(f"""\
        #!/bin/sh
        {KIT_SOURCE}
        tg_check_sh "agent variable absent" '[ -z "${{AGENT_SECRET:-}}" ]'
        tg_check_sh "TEST_DIR provided" '[ "$TEST_DIR" = /tests ]'
        tg_check_sh "runs in workdir" '[ "$(pwd)" = /app ]'
        tg_check_sh "image ENV kept" '[ "$GREETING" = "hi there" ]'
        tg_finish
        """)
    dockerfile = 'FROM debian:bookworm-slim\nENV GREETING="hi there"\nWORKDIR /app\n'
    task_dir = write_task(tmp_path, test_sh=test_sh, dockerfile=dockerfile)
    record = await trial(task_dir, backend, "export AGENT_SECRET=1; cd /tmp")
    assert record.resolved, record.assertions
