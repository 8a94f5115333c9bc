"""Trials on the embedded backend cancelled at random moments (while the sandbox starts, while the
shell starts, mid-command, while verifying): every one unwinds at once, none carries on as if it had
not been cancelled, and no sandbox is left on disk or running. Before ``termgym.aio`` this found
trials that never ended (a cancellation inside ``create_subprocess_exec``) and trials that ignored
their cancellation (CPython 3.11's ``asyncio.wait_for``)."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from termgym.agents import OracleAgent, ScriptedAgent
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import write_task

UNWIND_LIMIT_SEC = 10.0  # generous for a loaded machine; a stuck trial never unwinds at all


async def cancel_at(task, agent, delay: float) -> tuple[str, float]:
    """Run a trial, cancel it after ``delay`` seconds; its fate and how long it took to unwind."""
    trial = asyncio.create_task(run_trial(task, agent, EnvOptions(backend="local")))
    await asyncio.sleep(delay)
    if trial.done():
        return "finished first", 0.0
    trial.cancel()
    began = time.monotonic()
    done, _ = await asyncio.wait({trial}, timeout=UNWIND_LIMIT_SEC)
    if not done:
        return "stuck", UNWIND_LIMIT_SEC
    return ("cancelled" if trial.cancelled() else "ignored its cancellation"), time.monotonic() - began


@pytest.mark.slow
async def test_trials_cancelled_at_random_moments_unwind_and_leave_nothing(tmp_path, no_leaks):
    task = load_task(write_task(tmp_path, dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\nRUN mkdir -p /app/in\n"))
    agents = [OracleAgent(), ScriptedAgent(("ls /app", "echo done > /app/result.txt", "cat /app/result.txt"))]
    rng = random.Random(3)
    fates: list[str] = []
    for _ in range(4):
        rounds = await asyncio.gather(*(cancel_at(task, rng.choice(agents), rng.uniform(0, 1.2)) for _ in range(12)))
        fates += [fate for fate, _ in rounds]
        assert max(seconds for _, seconds in rounds) < UNWIND_LIMIT_SEC
    assert "stuck" not in fates and "ignored its cancellation" not in fates, fates
    assert fates.count("cancelled") >= 12  # the moments did fall inside trials
