"""Faults through the real SDK: rate limits and quotas never break the pace, failed creates leave
nothing behind, a sandbox that disappears ends its trial with a record while the run goes on."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque

import pytest

from termgym.agents import NullAgent, OracleAgent
from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.sandboxes.daytona.backend import DaytonaSandbox
from termgym.sandboxes.daytona.policy import paced_windows
from termgym.sandboxes.daytona.provider import get_provider
from termgym.sandboxes.pacing import Pacer, Window, max_in_any_window
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.termgym.sandboxes.daytona.server import Faults


def options() -> EnvOptions:
    return EnvOptions(backend="daytona", run_id="faults")


def create_requests(server) -> list:
    return [r for r in server.requests if r.method == "POST" and r.path == "/api/sandbox"]


@pytest.fixture
def faults() -> Faults:
    return Faults(create_rates={"429": 0.35, "quota": 0.15}, retry_after=0.2, throttle=(8, 2.0), seed=7)


async def test_bursts_of_429s_and_quota_errors_keep_the_pace(task_dir, daytona):
    provider = get_provider()
    # The production windows (spread grants, 6 per second, N per minute), with the minute scaled
    # to 10 per 3 s so that the test sees both bind at once within seconds, and a guard sized for
    # a loaded CI machine where the server shares this event loop (production: 0.03 s).
    guard = 0.15
    spread, second, _ = paced_windows(6, 600, guard)
    provider.pacer = Pacer([spread, second, Window(10, 3.0 + guard)])
    task = load_task(task_dir)
    records = await asyncio.gather(*(run_trial(task, NullAgent(), options()) for _ in range(14)))
    assert all(r.error is None and r.total == 2 for r in records)
    statuses = [r.status for r in create_requests(daytona)]
    assert statuses.count(429) >= 3 and statuses.count(400) >= 1 and statuses.count(200) == 14
    assert provider.create_attempts == len(daytona.create_times)  # every attempt went through the pacer
    assert max_in_any_window(daytona.create_times, 1.0) <= 6
    assert max_in_any_window(daytona.create_times, 3.0) <= 10
    assert max_in_any_window(daytona.create_times, 60.0) <= 600
    assert not daytona.live()


@pytest.mark.parametrize(
    ("script", "creates"),
    [
        (["429", "429", "ok"], 3),
        (["quota", "quota", "ok"], 3),
        (["500", "ok"], 2),
        (["500-after", "ok"], 2),  # created, then a 500: the first one is found by name and deleted
    ],
)
async def test_retried_creates_succeed_and_leave_nothing(task_dir, daytona, script, creates):
    daytona.faults.create_rates = {}
    daytona.faults.throttle = None
    daytona.faults.create_script = deque(script)
    record = await run_trial(load_task(task_dir), OracleAgent(), options())
    assert record.error is None and record.resolved
    assert len(daytona.create_times) == creates
    assert not daytona.live()


@pytest.mark.parametrize(
    ("setup", "fragment"),
    [
        (lambda f: setattr(f, "answer_delay", 4.0), "timed out"),  # the create outlives its timeout
        (lambda f: setattr(f, "create_latency", 30.0), "timed out"),  # the sandbox never starts in time
        (lambda f: f.storms.append(("POST", r"^/api/sandbox$", 503, 100)), "HTTP 503"),  # a 5xx storm
        (lambda f: f.create_script.extend(["500-after"] * 10), "transient"),
        (lambda f: f.create_script.append("error-state"), "error"),
    ],
)
async def test_failed_creates_end_the_trial_with_a_record_and_leave_nothing(task_dir, daytona, setup, fragment):
    daytona.faults.create_rates, daytona.faults.throttle = {}, None
    setup(daytona.faults)
    provider = get_provider()
    provider.settings = dataclasses.replace(provider.settings, create_timeout=2.0)
    started = time.monotonic()
    record = await run_trial(load_task(task_dir), OracleAgent(), options())
    assert record.error is not None and record.error["kind"] == "sandbox_error"
    assert fragment in record.error["message"]
    assert time.monotonic() - started < 30
    assert len(daytona.create_times) <= provider.settings.retry.transient_attempts
    await asyncio.sleep(0)
    assert not daytona.live(), [s.name for s in daytona.live()]
    assert provider.holding == 0  # the concurrency slot came back
    # The run goes on: once the fault is over, the next trial works.
    daytona.faults.storms.clear()
    daytona.faults.create_script.clear()
    daytona.faults.answer_delay = daytona.faults.create_latency = 0.0
    after = await run_trial(load_task(task_dir), OracleAgent(), options())
    assert after.error is None and after.resolved


class VanishingAgent:
    """Runs a command, has the server make its sandbox disappear, then tries to go on."""

    name = "vanishing"

    def __init__(self, server) -> None:
        self.server = server

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict):
        await env.step("echo done > /app/result.txt")
        sandbox = env.sandbox
        assert isinstance(sandbox, DaytonaSandbox)
        await self.server.kill(sandbox.sandbox_id)
        step = await env.step("cat /app/result.txt")
        if env.done:
            return step
        return await env.step(SUBMIT)


async def test_sandbox_that_disappears_mid_episode(task_dir, daytona):
    daytona.faults.create_rates, daytona.faults.throttle = {}, None
    task = load_task(task_dir)
    vanished, *others = await asyncio.gather(
        run_trial(task, VanishingAgent(daytona), options()),
        *(run_trial(task, OracleAgent(), options()) for _ in range(3)),
    )
    assert vanished.error is not None and vanished.error["kind"] == "sandbox_error"
    assert not vanished.resolved
    assert all(r.error is None and r.resolved for r in others)
    assert not daytona.live()


async def test_sandbox_gone_before_verification(task_dir, daytona):
    daytona.faults.create_rates, daytona.faults.throttle = {}, None

    class KillThenSubmit(VanishingAgent):
        async def run(self, env, instruction, info):
            await env.step("echo done > /app/result.txt")
            sandbox = env.sandbox
            assert isinstance(sandbox, DaytonaSandbox)
            await self.server.kill(sandbox.sandbox_id)
            return await env.step(SUBMIT)

    record = await run_trial(load_task(task_dir), KillThenSubmit(daytona), options())
    assert record.error is not None, record
    assert record.error["kind"] == "sandbox_error" and not record.resolved


async def test_cancelled_trial_deletes_its_sandbox(task_dir, daytona):
    daytona.faults.create_rates, daytona.faults.throttle = {}, None
    daytona.faults.create_latency = 2.0  # cancelled while the sandbox is still being created
    trial = asyncio.create_task(run_trial(load_task(task_dir), OracleAgent(), options()))
    while not daytona.create_times:
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.3)
    trial.cancel()
    with pytest.raises(asyncio.CancelledError):
        await trial
    assert not daytona.live()


@dataclasses.dataclass(frozen=True)
class LingeringAgent:
    """Holds its sandbox for a while before submitting, so that trials certainly overlap."""

    seconds: float
    name: str = "lingering"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict):
        await asyncio.sleep(self.seconds)
        return await env.step(SUBMIT)


async def test_concurrency_cap_bounds_live_sandboxes(task_dir, daytona):
    daytona.faults.create_rates, daytona.faults.throttle = {}, None
    provider = get_provider()
    provider.gate = asyncio.Semaphore(2)
    task = load_task(task_dir)
    records = await asyncio.gather(*(run_trial(task, LingeringAgent(0.5), options()) for _ in range(6)))
    assert all(r.error is None for r in records)
    assert daytona.peak_live == 2  # the cap is reached (trials overlap) and never exceeded
    assert not daytona.live()
