"""Held-out evaluation: the policy on every task of a fixed set, through the normal trial path
(fresh sandbox, the task's own verifier), decoding greedily or sampling several episodes per task.

Greedy decoding shows what the policy does when deployed; sampling at temperature 1 (``samples=k``)
measures the distribution PPO actually trains, with k times the episodes, so a change shows through
the noise of a small set sooner. Each sampled episode's random stream is fixed by (seed, task,
sample index): two policies evaluated with the same seed face the same draws.

Guarantees: every task runs exactly once per sample (once when greedy) and every trial's record is
kept (an infrastructure fault counts as unresolved with zero assertions, and is counted in
``errors``); the result is a function of the weights, the tasks and the seed alone, whatever the
batching (up to float rounding between batched and cached forwards).
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from termgym.agents.renderers import Renderer
from termgym.env import AsyncTerminalEnv, EnvOptions
from termgym.records import TrialRecord
from termgym.tasks import Task
from termgym.trial import StepReturn, run_trials

from .rollout import RolloutSettings, run_policy_episode, stream_seed
from .sampler import BatchedSampler, Sampler
from .trajectory import Trajectory


@dataclass(frozen=True)
class EvalSummary:
    tasks: int
    resolved: float  # share of episodes resolved
    passed: float  # mean assertions passed per episode
    reward: float  # mean reward
    errors: int  # trials that ended in an infrastructure fault
    families: dict[str, dict[str, float]] = field(default_factory=dict)  # family -> tasks, resolved, passed
    task_rates: dict[str, float] = field(default_factory=dict)  # task -> share of its episodes resolved
    samples: int = 0  # episodes per task sampled at temperature 1; 0: one greedy episode
    passed_share: float = 0.0  # mean share of its task's assertions an episode passed

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PairedChange:
    """How a second evaluation of the same tasks differs from the first, task by task."""

    gained: int  # tasks resolved more often after (greedy: resolved after, not before)
    lost: int  # tasks resolved less often after
    p_value: float  # two-sided exact sign test (McNemar) on the tasks that changed; 1.0 when none did

    def describe(self, tasks: int) -> str:
        verdict = "significant at 5%" if self.p_value < 0.05 else "within noise"
        return (
            f"{self.gained} of {tasks} tasks gained, {self.lost} lost "
            f"(sign test on the changed tasks: p = {self.p_value:.2f}, {verdict})"
        )


def paired_change(before: EvalSummary, after: EvalSummary) -> PairedChange:
    """Pure: the tasks whose resolved rate rose and those whose rate fell, and the probability of a
    split at least that uneven if each changed task were equally likely to go either way."""
    names = set(before.task_rates) | set(after.task_rates)
    gained = sum(after.task_rates.get(n, 0.0) > before.task_rates.get(n, 0.0) for n in names)
    lost = sum(after.task_rates.get(n, 0.0) < before.task_rates.get(n, 0.0) for n in names)
    return PairedChange(gained, lost, sign_test(gained, lost))


def sign_test(gained: int, lost: int) -> float:
    """Pure: the two-sided exact sign test's p-value for ``gained`` changes one way and ``lost`` the
    other (1.0 when nothing changed)."""
    changed = gained + lost
    tail = sum(math.comb(changed, k) for k in range(min(gained, lost) + 1)) / 2**changed
    return min(1.0, 2 * tail)


def summarise_records(records: Sequence[TrialRecord], samples: int = 0) -> EvalSummary:
    """Pure: the summary of one evaluation's records (``samples`` per task, 0: one greedy each)."""
    by_family: dict[str, list[TrialRecord]] = defaultdict(list)
    by_task: dict[str, list[TrialRecord]] = defaultdict(list)
    for record in records:
        by_family[record.family].append(record)
        by_task[record.task].append(record)
    n = max(len(records), 1)
    return EvalSummary(
        tasks=len(by_task),
        resolved=sum(r.resolved for r in records) / n,
        passed=sum(r.passed for r in records) / n,
        reward=sum(r.reward for r in records) / n,
        errors=sum(r.error is not None and r.error.get("kind") not in ("agent_timeout",) for r in records),
        families={
            family: {
                "tasks": len({r.task for r in rs}),
                "resolved": sum(r.resolved for r in rs) / len(rs),
                "passed": sum(r.passed for r in rs) / len(rs),
            }
            for family, rs in sorted(by_family.items())
        },
        task_rates={task: sum(r.resolved for r in rs) / len(rs) for task, rs in sorted(by_task.items())},
        samples=samples,
        passed_share=sum(r.passed / r.total for r in records if r.total) / n,
    )


@dataclass
class _EvalAgent:
    sampler: Sampler
    renderer: Renderer
    settings: RolloutSettings
    generator: torch.Generator | None  # None: greedy
    trajectory: Trajectory
    name: str = "policy-eval"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> StepReturn | None:
        return await run_policy_episode(
            env, instruction, info, self.sampler, self.renderer, self.settings, self.generator, self.trajectory
        )


async def evaluate(
    policy,
    renderer: Renderer,
    tasks: Sequence[Task],
    options: EnvOptions,
    settings: RolloutSettings,
    *,
    concurrency: int = 8,
    samples: int = 0,
    seed: int = 0,
    sampler: Sampler | None = None,
    on_record: Callable[[TrialRecord, Trajectory], None] | None = None,
    batched: bool = True,
) -> tuple[EvalSummary, list[TrialRecord]]:
    """Run ``policy`` on each task through the model agent's loop, greedily once (``samples=0``) or
    ``samples`` times at temperature 1, ``concurrency`` trials at a time (their next-token requests
    batched together, unless ``batched`` is False: then each request is its own forward and the
    results depend on nothing but the seed); returns the summary and the records in task order.
    ``sampler``: what samples (default: the torch sampler over a copy of ``policy``, closed at the
    end; a sampler given is left open)."""
    own = sampler is None
    if sampler is None:
        pad_id = renderer.tokenizer.pad_token_id
        sampler = BatchedSampler(
            copy.deepcopy(policy).eval(), pad_id=pad_id or 0, record_routing=False, batched=batched
        )
    chosen: Sampler = sampler

    def agent(task: Task, sample: int | None) -> _EvalAgent:
        generator = (
            None if sample is None else torch.Generator().manual_seed(stream_seed("eval", seed, task.name, sample))
        )
        return _EvalAgent(chosen, renderer, settings, generator, Trajectory(task=task.name))

    def recorded(record: TrialRecord, agent: _EvalAgent) -> None:
        if on_record is not None:
            on_record(record, agent.trajectory)

    draws = [(task, None) for task in tasks] if samples < 1 else [(task, i) for task in tasks for i in range(samples)]
    jobs = [(task, agent(task, sample)) for task, sample in draws]
    try:
        records = await run_trials(jobs, options, concurrency=max(1, concurrency), on_record=recorded)
    finally:
        if own:
            chosen.close()
    return summarise_records(records, max(samples, 0)), records
