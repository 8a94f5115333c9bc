"""Attack on cancellation waiting for the sandbox's stop (``termgym.aio.run_to_end``): since a
cancelled trial now waits until its sandbox is stopped, an agent whose processes resist stopping
(ignore SIGTERM and keep forking) would hang every cancelled trial, and with it a scheduler that
cancels stragglers, if the stop could be held up. It cannot: the trial still unwinds within the
cancellation test's limit and leaves nothing running or on disk."""

from __future__ import annotations

import asyncio
import time

from termgym.agents import ScriptedAgent
from termgym.episode.options import EnvOptions
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import write_task
from tests.termgym.test_cancellation import UNWIND_LIMIT_SEC

RESIST = (
    'sh -c \'trap "" TERM HUP INT; while :; do sh -c "trap \\"\\" TERM; sleep 30" & sleep 0.05; done\''
    " >/dev/null 2>&1 &"
)


async def test_processes_that_resist_their_stop_do_not_hold_a_cancelled_trial(tmp_path, no_leaks):
    task = load_task(write_task(tmp_path, dockerfile="FROM debian:bookworm-slim\nWORKDIR /app\n"))
    trial = asyncio.create_task(run_trial(task, ScriptedAgent((RESIST, "sleep 60")), EnvOptions(backend="local")))
    await asyncio.sleep(3.0)  # the forking loop has been running for a while, the agent sleeps
    assert not trial.done()
    trial.cancel()
    began = time.monotonic()
    done, _ = await asyncio.wait({trial}, timeout=UNWIND_LIMIT_SEC)
    assert done and trial.cancelled(), "the cancelled trial did not unwind"
    assert time.monotonic() - began < UNWIND_LIMIT_SEC
