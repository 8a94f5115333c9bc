"""The latency model behind simulated sandboxes: how long trials take, per task family.

A trial is planned up front from the model and a random generator (``plan_trial``, no I/O): the
sandbox's creation latency, whether creation fails, the agent's turns and the time each takes, the
verifier's time, whether the sandbox is lost mid-trial, whether the verifier passes, and the time
to delete the sandbox. Agent time per family is lognormal (a median and a shape ``sigma``; the
larger ``sigma``, the heavier the tail), capped at the agent timeout; longer trials take more turns.

``BUNDLED`` gives the four bundled families relative durations that follow the tasks themselves:
``file-ops`` are one- or two-command jobs, ``text-processing`` and ``archives`` take a few
inspect-and-transform rounds, ``shell-scripting`` means writing, running and debugging a script,
so it is the longest family with the heaviest tail (the family a straggler cut removes first).
The absolute scale (minutes per trial, a few seconds to create a sandbox, about one creation in
500 failing) is that of an LLM agent on cloud sandboxes, as in the published run; nothing here
is measured on this machine.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass

from termgym.errors import ConfigError


@dataclass(frozen=True)
class FamilyLatency:
    """One family's trials: agent time lognormal(median, sigma) seconds, turns, verifier pass rate."""

    median_seconds: float
    sigma: float
    median_turns: float
    resolve_rate: float = 0.5

    def __post_init__(self) -> None:
        if self.median_seconds <= 0 or self.sigma < 0 or self.median_turns < 1 or not 0 <= self.resolve_rate <= 1:
            raise ConfigError(f"invalid family latency {self}")

    def quantile(self, q: float) -> float:
        """The agent time below which a share ``q`` of this family's trials fall (before the cap)."""
        return self.median_seconds * math.exp(self.sigma * _normal_quantile(q))


@dataclass(frozen=True)
class LatencyModel:
    families: Mapping[str, FamilyLatency]
    default: FamilyLatency = FamilyLatency(300.0, 0.6, 12)  # a family the model does not name
    create_median: float = 3.0  # seconds from the create call to a usable sandbox
    create_sigma: float = 0.5
    release_median: float = 1.0  # seconds to delete a sandbox
    verify_median: float = 8.0
    failure_rate: float = 0.002  # sandbox creation fails (a provider error)
    loss_rate: float = 0.001  # the sandbox is lost mid-trial
    max_agent_seconds: float = 1800.0  # the agent timeout: no trial's agent phase runs longer
    max_turns: int = 50  # the env's turn budget

    def __post_init__(self) -> None:
        if not (0 <= self.failure_rate < 1 and 0 <= self.loss_rate < 1):
            raise ConfigError("failure_rate and loss_rate must be in [0, 1)")
        if self.create_median <= 0 or self.release_median < 0 or self.verify_median < 0 or self.max_agent_seconds <= 0:
            raise ConfigError("latencies must be positive")

    def family(self, name: str) -> FamilyLatency:
        return self.families.get(name, self.default)


@dataclass(frozen=True)
class TrialPlan:
    """Everything a simulated trial will do, decided before it starts."""

    create_seconds: float
    create_fails: bool
    turn_seconds: tuple[float, ...]
    lost_at_turn: int | None  # the sandbox disappears during this turn (0-based); None: never
    verify_seconds: float
    resolved: bool
    release_seconds: float
    family: str = ""

    @property
    def turns(self) -> int:
        return len(self.turn_seconds)

    @property
    def agent_seconds(self) -> float:
        return sum(self.turn_seconds)


def plan_trial(model: LatencyModel, family: str, rng: random.Random) -> TrialPlan:
    """Draw one trial of ``family``. Deterministic given ``rng``'s state; draws a fixed number of
    values per call, so plans for the same generator sequence never depend on the outcomes."""
    fam = model.family(family)
    create = _lognormal(rng, model.create_median, model.create_sigma)
    create_fails = rng.random() < model.failure_rate
    agent = min(_lognormal(rng, fam.median_seconds, fam.sigma), model.max_agent_seconds)
    # Longer trials take more turns, less than proportionally (turns also get longer).
    turns = round(fam.median_turns * (agent / fam.median_seconds) ** 0.6 * math.exp(0.2 * rng.gauss(0, 1)))
    turns = max(1, min(turns, model.max_turns))
    lost = rng.random() < model.loss_rate
    lost_at = rng.randrange(turns)
    verify = _lognormal(rng, model.verify_median, 0.3) if model.verify_median > 0 else 0.0
    resolved = rng.random() < fam.resolve_rate
    release = _lognormal(rng, model.release_median, 0.3) if model.release_median > 0 else 0.0
    return TrialPlan(
        create_seconds=create,
        create_fails=create_fails,
        turn_seconds=tuple([agent / turns] * turns),
        lost_at_turn=lost_at if lost else None,
        verify_seconds=verify,
        resolved=resolved,
        release_seconds=release,
        family=family,
    )


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(sigma * rng.gauss(0.0, 1.0))


def _normal_quantile(q: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(q)


BUNDLED = LatencyModel(
    families={
        "file-ops": FamilyLatency(median_seconds=150.0, sigma=0.45, median_turns=8, resolve_rate=0.7),
        "text-processing": FamilyLatency(median_seconds=240.0, sigma=0.5, median_turns=12, resolve_rate=0.6),
        "archives": FamilyLatency(median_seconds=270.0, sigma=0.55, median_turns=12, resolve_rate=0.6),
        "shell-scripting": FamilyLatency(median_seconds=420.0, sigma=0.85, median_turns=20, resolve_rate=0.4),
    }
)
