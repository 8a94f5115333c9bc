"""Transcripts: every step of every agent recorded by the environment, the stop reason named, and
the file written for failed and cancelled trials too."""

from __future__ import annotations

import asyncio
import json

import pytest

from termgym.agents import NullAgent, OracleAgent, ScriptedAgent
from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from termgym.transcript import SCHEMA, read_transcript
from termgym.trial import run_trial


async def test_a_scripted_trial_leaves_every_step_and_its_stop_reason(task_dir, tmp_path, no_leaks):
    options = EnvOptions(trials_dir=str(tmp_path / "trials"))
    record = await run_trial(load_task(task_dir), ScriptedAgent(("echo done > result.txt", "exit 3")), options)
    assert record.transcript == str(tmp_path / "trials" / record.trial_id / "trajectory.json")
    data = read_transcript(tmp_path / "trials" / record.trial_id)
    assert data["schema"] == SCHEMA and data["trial_id"] == record.trial_id and data["agent"] == "scripted"
    assert [t["action"]["kind"] for t in data["turns"]] == ["command", "command", "submit"]
    first, second = data["turns"][0], data["turns"][1]
    assert first["action"]["command"] == "echo done > result.txt" and first["result"]["exit_code"] == 0
    assert second["result"]["exit_code"] == 3 and second["observation"].endswith("[exit code 3]")
    assert first["result"]["duration"] >= 0 and first["reply"] is None
    assert data["stop_reason"] == record.stop_reason == "submitted" and record.resolved


async def test_the_turn_budget_is_a_named_truncation(task_dir, no_leaks):
    async with AsyncTerminalEnv(load_task(task_dir), EnvOptions(max_turns=1)) as env:
        await env.reset()
        _, _, terminated, truncated, info = await env.step("true")
        assert truncated and not terminated and info["stop_reason"] == "max_turns"
        assert env.transcript.stop_reason == "max_turns"


async def test_an_agent_gives_up_with_its_own_reason_and_is_still_verified(task_dir, no_leaks):
    async with AsyncTerminalEnv(load_task(task_dir)) as env:
        await env.reset()
        await env.step("echo done > result.txt")
        _, reward, terminated, truncated, info = await env.truncate("context_exhausted")
        assert truncated and not terminated and info["stop_reason"] == "context_exhausted"
        assert info["resolved"] and reward > 0  # the work done counts
        assert env.remaining_time == 0.0


async def test_the_agent_timeout_is_its_stop_reason(task_dir, no_leaks):
    async with AsyncTerminalEnv(load_task(task_dir), EnvOptions(agent_timeout=0.5)) as env:
        await env.reset()
        assert 0 < env.remaining_time <= 0.5
        _, _, _, truncated, info = await env.step("sleep 5")
        assert truncated and info["stop_reason"] == "agent_timeout" and env.transcript.turns[0]["result"]["timed_out"]


async def test_the_oracle_and_null_agents_leave_transcripts(task_dir, tmp_path, no_leaks):
    options = EnvOptions(trials_dir=str(tmp_path))
    oracle = await run_trial(load_task(task_dir), OracleAgent(), options)
    null = await run_trial(load_task(task_dir), NullAgent(), options)
    assert oracle.transcript is not None and null.transcript is not None
    oracle_turns = read_transcript(oracle.transcript)["turns"]
    assert (
        oracle_turns[0]["action"]["command"].startswith("bash /solution/")
        and oracle_turns[-1]["action"]["kind"] == "submit"
    )
    assert [t["action"]["kind"] for t in read_transcript(null.transcript)["turns"]] == ["submit"]


async def test_a_cancelled_trial_still_writes_its_transcript(task_dir, tmp_path, no_leaks):
    options = EnvOptions(trials_dir=str(tmp_path))
    trial = asyncio.ensure_future(run_trial(load_task(task_dir), ScriptedAgent(("sleep 30",)), options))
    await asyncio.sleep(1.0)
    trial.cancel()
    with pytest.raises(asyncio.CancelledError):
        await trial
    (written,) = list(tmp_path.glob("*/trajectory.json"))
    assert json.loads(written.read_text())["stop_reason"] == "cancelled"


def test_a_file_that_is_not_a_transcript_is_refused(tmp_path):
    (tmp_path / "trajectory.json").write_text('{"schema": "something else"}')
    with pytest.raises(ValueError, match="not a termgym transcript"):
        read_transcript(tmp_path)


async def test_submit_is_recorded_before_verification(task_dir, no_leaks):
    async with AsyncTerminalEnv(load_task(task_dir)) as env:
        await env.reset()
        await env.step(SUBMIT)
        assert env.transcript.turns[-1]["action"] == {"kind": "submit"} and env.transcript.stop_reason == "submitted"
