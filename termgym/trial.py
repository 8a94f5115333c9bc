"""One trial: a fresh environment, an agent driving it to the end, verification, and its record.

``run_trial`` always returns a ``TrialRecord``: infrastructure faults (the sandbox failed, the build
failed, the model could not be reached) become the record's ``error``, never an exception, and so
does anything unexpected (a bug of termgym's, whatever the agent left triggering it): error kind
``internal_error``, the traceback in ``record.logs["traceback"]``, counted like any verdict (reward
0, never retried), so that neither the batch nor the trial's own record is lost; only cancellation
propagates, after the sandbox has been stopped. A sandbox the agent broke is
``broken_by_agent`` (``termgym.episode.outcomes.fault``). With ``EnvOptions.trials_dir`` every trial, failed
and cancelled ones too, writes its transcript to ``trials_dir/<trial_id>/trajectory.json``, and
the task's artifacts go to ``trials_dir/<trial_id>/artifacts/`` (``record.artifacts``). The record
also holds the network each phase asked for and got (``record.network``) and, for a multi-step
task, each step's result (``record.steps``) with the reward by the task's strategy.
"""

from __future__ import annotations

import asyncio
import time
import traceback
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Protocol, TypeVar

from termgym.aio import gather_limited
from termgym.env import AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.episode.outcomes import fault, fault_stop_reason
from termgym.episode.spec import SandboxFactory
from termgym.errors import ConfigError, EnvironmentBuildError, ModelError, SandboxError
from termgym.records import TrialRecord
from termgym.sandboxes.base import Sandbox
from termgym.sandboxes.placement import current_node
from termgym.tasks import Task
from termgym.transcript import write_transcript

# What a Gymnasium step returns: (observation, reward, terminated, truncated, info).
StepReturn = tuple[str, float, bool, bool, dict]


class Agent(Protocol):
    """What drives an episode: named in its trial's record."""

    @property
    def name(self) -> str: ...

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> StepReturn | None:
        """Drive ``env`` until the episode ends; return the final step (None if it never stepped)."""


async def run_trial(
    task: Task,
    agent: Agent,
    options: EnvOptions,
    *,
    sandbox_factory: SandboxFactory | None = None,
    attached: Sandbox | None = None,
) -> TrialRecord:
    started = time.monotonic()
    record = TrialRecord(
        task=task.name,
        backend=options.backend,
        agent=agent.name,
        run_id=options.run_id,
        trial_id=uuid.uuid4().hex[:12],
        family=task.family,
        reward_scale=options.reward_scale,
    )
    env = AsyncTerminalEnv(task, options, sandbox_factory=sandbox_factory, attached=attached)
    record.overrides = dict(env.overrides)
    if options.trials_dir is not None:
        env.trial_dir = Path(options.trials_dir) / record.trial_id  # the task's artifacts are copied there
    try:
        async with env:
            instruction, info = await env.reset()
            step = await agent.run(env, instruction, info)
            record = _fill(record, env, step)
    except EnvironmentBuildError as exc:
        record.error = {"kind": "build_failed", "message": str(exc)}
        record.logs["build"] = exc.log[-20000:]
    except SandboxError as exc:
        record.error = fault(exc, agent_acted=env.turns > 0)
        env.transcript.stop(fault_stop_reason(record.error))
    except ModelError as exc:
        record.error = {"kind": "model_error", "message": str(exc)}
        env.transcript.stop("model_error")
    except ConfigError as exc:
        record.error = {"kind": "invalid_task", "message": str(exc)}
    except Exception as exc:
        first_line = (str(exc).strip().splitlines() or [""])[0][:300]
        record.error = {"kind": "internal_error", "message": f"{type(exc).__name__}: {first_line}".rstrip(": ")}
        record.logs["traceback"] = traceback.format_exc()[-20000:]
        env.transcript.stop("internal_error")  # unless it had ended already (the first reason wins)
    except asyncio.CancelledError:
        env.transcript.stop("cancelled")
        _keep_transcript(record, env, options)
        raise
    record.turns = record.turns or env.turns
    record.timings = {**env.timings, "total": time.monotonic() - started}
    record.system_changes = env.system_changes
    record.image = dict(env.image)
    record.node = env.node or current_node.get() or ""  # the Ray node, else the scheduler's
    record.kept = env.kept
    record.network = dict(env.network)
    record.artifacts = list(env.artifacts)
    record.steps = [result.as_dict() for result in env.step_results]
    # every warning of the episode, --keep's too (added after the sandbox closed, so after _fill)
    record.warnings += [w for w in env.warnings if w not in record.warnings]
    _keep_transcript(record, env, options)
    return record


def _keep_transcript(record: TrialRecord, env: AsyncTerminalEnv, options: EnvOptions) -> None:
    """The record's view of the transcript, and the transcript's file when the run keeps them."""
    transcript = env.transcript
    transcript.trial_id, transcript.agent = record.trial_id, record.agent
    record.model = transcript.model
    record.stop_reason = transcript.stop_reason
    record.parse_errors = transcript.parse_errors
    if transcript.usage.requests:
        usage = transcript.usage
        record.usage = {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "requests": usage.requests,
        }
    if options.trials_dir is not None:
        path = write_transcript(Path(options.trials_dir) / record.trial_id, transcript)
        record.transcript = str(path)


AgentT = TypeVar("AgentT", bound=Agent)


async def run_trials(
    jobs: Sequence[tuple[Task, AgentT]],
    options: EnvOptions,
    *,
    concurrency: int,
    on_record: Callable[[TrialRecord, AgentT], None] | None = None,
) -> list[TrialRecord]:
    """Every ``(task, agent)`` trial of ``jobs``, at most ``concurrency`` at once. ``on_record`` gets
    each record (with its job's agent) as soon as its trial ends; the records come back in job
    order. Like ``run_trial``, a trial's fault is its record's error, never an exception."""
    if concurrency < 1:
        raise ConfigError(f"concurrency must be at least 1, got {concurrency}")

    async def one(task: Task, agent: AgentT) -> TrialRecord:
        record = await run_trial(task, agent, options)
        if on_record is not None:
            on_record(record, agent)
        return record

    return await gather_limited([lambda t=task, a=agent: one(t, a) for task, agent in jobs], concurrency)


def _fill(record: TrialRecord, env: AsyncTerminalEnv, step: StepReturn | None) -> TrialRecord:
    record = replace(record, turns=env.turns, error=env.error, warnings=list(env.warnings))
    verification = env.verification
    if verification is None:
        return record
    report = verification.report
    record.resolved = report.resolved
    record.reward = verification.reward
    record.passed = report.passed
    record.total = report.total
    record.assertions = [{"name": a.name, "passed": a.passed} for a in report.assertions if a.status != "skipped"]
    record.report_format = report.format
    record.logs["verifier"] = verification.output[-20000:]
    grade = env.grade
    if grade is not None:  # a multi-step task: the strategy's grade over its steps, assertions named by step
        record.resolved, record.reward, record.passed, record.total = (
            grade.resolved,
            grade.reward,
            grade.passed,
            grade.total,
        )
        record.assertions = list(grade.assertions)
    return record
