"""Multi-step tasks (Harbor's ``[[steps]]``): one step's task view and the trial's grade from the
steps' results.

A step is verified like a whole task with the step's own tests, test script and verifier timeout
(``step_task``). The trial's grade follows ``multi_step_reward_strategy`` as Harbor defines it:
``mean`` averages the reward of every verified step (a step that could not be verified is left out
of the mean, as Harbor leaves out a step without a verifier result), ``final`` is the last verified
step's. ``resolved``, ``passed`` and ``total`` come from the same steps the strategy counts: for
``mean`` every counted step must be resolved and the counts add up, for ``final`` they are the last
step's. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from termgym.tasks import Task, TaskStep


@dataclass(frozen=True)
class StepResult:
    """One verified step: what the record's ``steps`` lists (``as_dict``)."""

    name: str
    reward: float
    resolved: bool
    passed: int
    total: int
    assertions: tuple[dict[str, Any], ...] = ()  # {"name", "passed"} as the step's report gave them
    error: str | None = None  # the step's verifier error, if any

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "reward": self.reward,
            "resolved": self.resolved,
            "passed": self.passed,
            "total": self.total,
            **({"error": self.error} if self.error else {}),
        }


@dataclass(frozen=True)
class Grade:
    """The trial's grade from its steps (``combine``)."""

    reward: float
    resolved: bool
    passed: int
    total: int
    assertions: tuple[dict[str, Any], ...]  # the counted steps', each name prefixed "<step>: "


def step_task(task: Task, step: TaskStep) -> Task:
    """The task as one step's verifier sees it: the step's tests, test script and verifier
    timeout; the assertion count the task declares is not the step's, so none is held to."""
    return replace(
        task,
        instruction=step.instruction,
        tests_dir=step.tests_dir,
        test_script=step.test_script,
        verifier_timeout_sec=step.verifier_timeout_sec,
        agent_timeout_sec=step.agent_timeout_sec,
        solution_dir=step.solution_dir,
        solution_script=step.solution_script,
        expected_assertions=None,
        layout="harbor",
    )


def combine(results: Sequence[StepResult], strategy: str) -> Grade:
    """The trial's grade by ``strategy`` ("mean" or "final"); reward 0, unresolved, when no step
    was verified."""
    if not results:
        return Grade(0.0, False, 0, 0, ())
    counted = list(results) if strategy == "mean" else [results[-1]]
    return Grade(
        reward=sum(r.reward for r in counted) / len(counted),
        resolved=all(r.resolved for r in counted),
        passed=sum(r.passed for r in counted),
        total=sum(r.total for r in counted),
        assertions=tuple({**a, "name": f"{r.name}: {a['name']}"} for r in counted for a in r.assertions),
    )
