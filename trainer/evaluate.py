"""Held-out evaluation: the policy, decoding greedily, on every task of a fixed set, through the
normal trial path (fresh sandbox, the task's own verifier).

Guarantees: every task runs exactly once and every trial's record is kept (an infrastructure fault
counts as unresolved with zero assertions, and is counted in ``errors``); greedy decoding makes the
result a function of the weights and the tasks alone, whatever the batching.
"""

from __future__ import annotations

import asyncio
import copy
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from termgym.env import AsyncTerminalEnv, EnvOptions
from termgym.records import TrialRecord
from termgym.tasks import Task
from termgym.trial import Step, run_trial
from trainer.rollout import BatchedSampler, ChatFormat, RolloutSettings, Trajectory, drive_episode


@dataclass(frozen=True)
class EvalSummary:
    tasks: int
    resolved: float  # share of tasks resolved
    passed: float  # mean assertions passed per task
    reward: float  # mean reward
    errors: int  # trials that ended in an infrastructure fault
    families: dict[str, dict[str, float]] = field(default_factory=dict)  # family -> tasks, resolved, passed
    resolved_tasks: tuple[str, ...] = ()  # names of the tasks resolved, sorted

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PairedChange:
    """How a second evaluation of the same tasks differs from the first, task by task."""

    gained: int  # tasks resolved after, not before
    lost: int  # tasks resolved before, not after
    p_value: float  # two-sided exact sign test (McNemar) on the tasks that changed; 1.0 when none did

    def describe(self, tasks: int) -> str:
        verdict = "significant at 5%" if self.p_value < 0.05 else "within noise"
        return (f"{self.gained} of {tasks} tasks gained, {self.lost} lost "
                f"(sign test on the changed tasks: p = {self.p_value:.2f}, {verdict})")  # fmt: skip


def paired_change(before: EvalSummary, after: EvalSummary) -> PairedChange:
    """Pure: the tasks each evaluation resolved and the other did not, and the probability of a split
    at least that uneven if each changed task were equally likely to go either way."""
    first, second = set(before.resolved_tasks), set(after.resolved_tasks)
    gained, lost = len(second - first), len(first - second)
    changed = gained + lost
    tail = sum(math.comb(changed, k) for k in range(min(gained, lost) + 1)) / 2**changed
    return PairedChange(gained, lost, min(1.0, 2 * tail))


def summarise_records(records: Sequence[TrialRecord]) -> EvalSummary:
    """Pure: the summary of one evaluation's records."""
    by_family: dict[str, list[TrialRecord]] = defaultdict(list)
    for record in records:
        by_family[record.family].append(record)
    n = max(len(records), 1)
    return EvalSummary(
        tasks=len(records),
        resolved=sum(r.resolved for r in records) / n,
        passed=sum(r.passed for r in records) / n,
        reward=sum(r.reward for r in records) / n,
        errors=sum(r.error is not None and r.error.get("kind") not in ("agent_timeout",) for r in records),
        families={
            family: {"tasks": len(rs), "resolved": sum(r.resolved for r in rs) / len(rs), "passed": sum(r.passed for r in rs) / len(rs)}
            for family, rs in sorted(by_family.items())
        },
        resolved_tasks=tuple(sorted(r.task for r in records if r.resolved)),
    )  # fmt: skip


@dataclass
class _GreedyAgent:
    sampler: BatchedSampler
    chat: ChatFormat
    settings: RolloutSettings
    trajectory: Trajectory
    name: str = "policy-greedy"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> Step | None:
        return await drive_episode(env, instruction, self.sampler, self.chat, self.settings, None, self.trajectory)


async def evaluate(policy, tokenizer, tasks: Sequence[Task], options: EnvOptions, settings: RolloutSettings, *,
                   concurrency: int = 8, on_record: Callable[[TrialRecord, Trajectory], None] | None = None,
                   ) -> tuple[EvalSummary, list[TrialRecord]]:  # fmt: skip
    """Run ``policy`` greedily on each task once, ``concurrency`` trials at a time (their next-token
    requests batched together); returns the summary and the records in task order."""
    sampler = BatchedSampler(copy.deepcopy(policy).eval(), pad_id=tokenizer.pad_token_id, record_routing=False)
    chat = ChatFormat(tokenizer)
    gate = asyncio.Semaphore(max(1, concurrency))

    async def one(task: Task) -> TrialRecord:
        trajectory = Trajectory(task=task.name)
        async with gate:
            record = await run_trial(task, _GreedyAgent(sampler, chat, settings, trajectory), options)
        if on_record is not None:
            on_record(record, trajectory)
        return record

    records = list(await asyncio.gather(*(one(task) for task in tasks)))
    return summarise_records(records), records
