"""The async environment: Gymnasium semantics, budgets, and cleanup on every path."""

from __future__ import annotations

import asyncio
import time

import pytest

import termgym
from termgym.agents import ScriptedAgent
from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.errors import EpisodeError
from termgym.sandboxes.local.sandbox import LocalSandbox
from termgym.tasks import load_task
from termgym.trial import run_trial


async def test_reset_step_submit_gives_dense_reward(task_dir, no_leaks):
    async with termgym.make(str(task_dir), backend="local") as env:
        obs, info = await env.reset(seed=7)
        assert "result.txt" in obs and info["workdir"] == "/app"
        obs, reward, terminated, truncated, info = await env.step("echo done > result.txt; pwd")
        assert obs == "/app\n" and reward == 0.0 and not terminated and not truncated
        obs, reward, terminated, truncated, info = await env.step(SUBMIT)
        assert terminated and not truncated
        assert info["resolved"] and info["passed"] == 2 and info["total"] == 2
        assert reward == pytest.approx(2 / 20)
        assert info["report_format"] == "ctrf"


async def test_partial_progress_earns_partial_reward(task_dir, no_leaks):
    async with termgym.make(str(task_dir)) as env:
        await env.reset()
        await env.step("echo nope > /app/result.txt")
        _, reward, _, _, info = await env.step(SUBMIT)
        assert reward == pytest.approx(1 / 20) and not info["resolved"]
        assert [a["passed"] for a in info["assertions"]] == [True, False]


async def test_nonzero_exit_is_shown_in_observation(task_dir, no_leaks):
    async with termgym.make(str(task_dir)) as env:
        await env.reset()
        obs, *_, info = await env.step("ls /nonexistent")
        assert "No such file" in obs and obs.rstrip().endswith("[exit code 2]")
        assert info["exit_code"] == 2


async def test_max_turns_truncates_and_still_verifies(task_dir, no_leaks):
    async with termgym.make(str(task_dir), max_turns=2) as env:
        await env.reset()
        assert (await env.step("echo done > result.txt"))[3] is False
        _obs, reward, terminated, truncated, info = await env.step("true")
        assert truncated and not terminated and info["resolved"] and reward > 0
        with pytest.raises(EpisodeError):
            await env.step("true")


async def test_agent_timeout_truncates_within_bound(task_dir, no_leaks):
    async with termgym.make(str(task_dir), agent_timeout=1.5) as env:
        await env.reset()
        started = time.monotonic()
        _obs, _reward, _terminated, truncated, info = await env.step("echo done > result.txt; sleep 600")
        assert time.monotonic() - started < 1.5 + 5
        assert truncated and info["timed_out"] and info["error"]["kind"] == "agent_timeout"
        assert info["resolved"]  # the verifier ran on the state left behind


async def test_step_before_reset_is_an_error(task_dir):
    env = termgym.make(str(task_dir))
    with pytest.raises(EpisodeError):
        await env.step("true")


async def test_reset_again_starts_a_fresh_sandbox(task_dir, no_leaks):
    async with termgym.make(str(task_dir)) as env:
        await env.reset()
        await env.step("echo leftover > /app/x")
        await env.reset()
        obs, *_ = await env.step("cat /app/x")
        assert "No such file" in obs


async def test_cancellation_mid_step_removes_the_sandbox(task_dir, no_leaks):
    env = AsyncTerminalEnv(load_task(task_dir), EnvOptions())

    async def episode():
        async with env:
            await env.reset()
            await env.step("sleep 600")

    job = asyncio.create_task(episode())
    await asyncio.sleep(1.5)
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert env.sandbox is None


async def test_a_cancellation_while_the_sandbox_stops_propagates_only_once_it_is_removed(
    task_dir, no_leaks, monkeypatch
):
    # asyncio.shield around the close let the cancellation through at once and left the stop
    # running unawaited: the cancelled episode returned with its sandbox still on disk.
    stopping = asyncio.Event()
    stop = LocalSandbox.stop

    async def slow_stop(self):
        stopping.set()
        await asyncio.sleep(0.5)
        await stop(self)

    monkeypatch.setattr(LocalSandbox, "stop", slow_stop)

    async def episode():
        async with termgym.make(str(task_dir)) as env:
            await env.reset()

    job = asyncio.create_task(episode())
    await stopping.wait()  # the episode is over; its sandbox is being stopped
    job.cancel()
    with pytest.raises(asyncio.CancelledError):
        await job
    assert [p.name for p in no_leaks.iterdir()] == []


async def test_exception_inside_async_with_removes_the_sandbox(task_dir, no_leaks):
    async def episode():
        async with termgym.make(str(task_dir)) as env:
            await env.reset()
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await episode()


def test_options_are_validated(task_dir):
    with pytest.raises(ValueError, match="max_turns must be at least 1, got 0"):
        termgym.make(str(task_dir), max_turns=0)


async def test_a_separate_verifier_gets_only_the_declared_artifacts_in_a_fresh_sandbox(tmp_path, no_leaks):
    import textwrap

    from tests.helpers import KIT_SOURCE, write_task

    test_sh = textwrap.dedent(f"""\
        #!/bin/sh
        {KIT_SOURCE}
        tg_check_sh "the declared artifact" 'grep -qx done /app/result.txt'
        tg_check_sh "the logs artifacts" 'grep -qx plot /logs/artifacts/plot.txt'
        tg_check_sh "nothing else of the agent's" '[ ! -e /app/other.txt ] && [ ! -e /tmp/scratch ] && [ ! -e /app/link ]'
        tg_finish
        """)
    task = load_task(
        write_task(
            tmp_path,
            test_sh=test_sh,
            verifier_toml='environment_mode = "separate"',
            top_toml='artifacts = ["/app/result.txt", "/app/link"]',
        )
    )
    commands = (
        "echo done > /app/result.txt; echo x > /app/other.txt; touch /tmp/scratch; ln -s /etc/passwd /app/link",
        "mkdir -p /logs/artifacts && echo plot > /logs/artifacts/plot.txt",
    )
    record = await run_trial(task, ScriptedAgent(commands), EnvOptions())
    assert record.resolved and record.total == 3, record.assertions
    assert any("1 artifact entries were not carried over" in w for w in record.warnings), record.warnings
