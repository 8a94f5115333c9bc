"""Straggler-bias accounting and the scheduler's arithmetic: pure functions, no I/O, no clock.

A step launches trials, keeps the first ``B`` that finish, and (depending on the mode) cancels or
carries the rest. Each trial's fate in a step is one ``TrialOutcome``: ``kept`` (in the batch),
``surplus`` (finished, but after the batch was full), ``cancelled``, ``failed`` (an infrastructure
fault), or ``carried`` (still running when the step ended; it is decided in a later step).
``tally`` counts them per family or per task; ``bias_report`` compares the share of each group
among launched trials with its share among kept trials, as a total-variation distance, and the
mean duration and turns of kept trials against launched ones.

Definitions (every step, and cumulatively by merging tallies):

- launched: trials started in this step (new ones and replacements of failed ones; a trial
  carried in from an earlier step was launched there);
- finished = kept + surplus; kept counts carried-in trials that entered this step's batch;
- shares are per group over all groups; TV(p, q) = 1/2 * sum |p_g - q_g|;
- the weighted kept share uses each kept trial's importance weight (1 unless the mode reweights);
- durations run from the sandbox's creation grant to the trial's end; for cancelled and carried
  trials that is the time so far, so the launched mean is a lower bound of the true mean, and the
  kept-versus-launched gap it shows understates the real one.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, get_args

from termgym.errors import ConfigError
from termgym.sandboxes.pacing import Window, next_grant_time

Fate = Literal["kept", "surplus", "cancelled", "failed", "carried"]
FATES: tuple[Fate, ...] = get_args(Fate)
PUBLISHED_LAUNCHED, PUBLISHED_BATCH = 560, 512  # the published run: 560 launched for a batch of 512


@dataclass(frozen=True)
class TrialOutcome:
    """One trial's fate in one step."""

    task: str
    family: str
    fate: Fate
    launched: bool  # started in this step (False: carried in from an earlier one)
    duration: float  # seconds from the creation grant to the end (so far, if cancelled or carried)
    turns: int
    weight: float = 1.0  # importance weight, for kept trials

    def __post_init__(self) -> None:
        if self.fate not in FATES:
            raise ConfigError(f"unknown fate {self.fate!r}; one of {', '.join(FATES)}")


@dataclass
class Tally:
    """Counts and sums for one family or task."""

    launched: int = 0
    finished: int = 0
    kept: int = 0
    cancelled: int = 0
    failed: int = 0
    carried: int = 0  # in flight at the end of the (latest) step
    kept_weight: float = 0.0
    launched_seconds: float = 0.0
    kept_seconds: float = 0.0
    launched_turns: int = 0
    kept_turns: int = 0

    def add(self, outcome: TrialOutcome) -> None:
        if outcome.launched:
            self.launched += 1
            self.launched_seconds += outcome.duration
            self.launched_turns += outcome.turns
        if outcome.fate in ("kept", "surplus"):
            self.finished += 1
        if outcome.fate == "kept":
            self.kept += 1
            self.kept_weight += outcome.weight
            self.kept_seconds += outcome.duration
            self.kept_turns += outcome.turns
        elif outcome.fate == "cancelled":
            self.cancelled += 1
        elif outcome.fate == "failed":
            self.failed += 1
        elif outcome.fate == "carried":
            self.carried += 1


def tally(
    outcomes: Iterable[TrialOutcome], key: Callable[[TrialOutcome], str] = lambda o: o.family
) -> dict[str, Tally]:
    """Per group (``key``: family by default), the counts and sums of ``outcomes``."""
    groups: dict[str, Tally] = {}
    for outcome in outcomes:
        groups.setdefault(key(outcome), Tally()).add(outcome)
    return dict(sorted(groups.items()))


def merge_tallies(total: Mapping[str, Tally], step: Mapping[str, Tally]) -> dict[str, Tally]:
    """Cumulative tallies after one more step: every count adds up, except ``carried``, which is
    what is in flight now (the step's own)."""
    merged: dict[str, Tally] = {}
    for name in sorted(set(total) | set(step)):
        before, now = total.get(name, Tally()), step.get(name, Tally())
        values = {f: getattr(before, f) + getattr(now, f) for f in Tally.__dataclass_fields__}
        values["carried"] = now.carried
        merged[name] = Tally(**values)
    return merged


def shares(counts: Mapping[str, float]) -> dict[str, float]:
    """Each group's fraction of the total (all zero when the total is zero)."""
    total = sum(counts.values())
    return {name: (count / total if total else 0.0) for name, count in counts.items()}


def total_variation(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    """Total-variation distance between two distributions over groups (missing groups count 0),
    summed in the groups' sorted order: a set's order changes with the process's string hashing,
    and a float sum with its order."""
    return 0.5 * sum(abs(p.get(name, 0.0) - q.get(name, 0.0)) for name in sorted(set(p) | set(q)))


def importance_weights(launched: Mapping[str, int], kept: Mapping[str, int]) -> dict[str, float]:
    """Per-group weights w_g = launched share / kept share, for groups with kept trials.

    Under these weights the kept batch has each group's launched share. They are scaled so the
    mean weight over kept trials is 1 (the loss keeps its scale); a group launched but never kept
    cannot be restored, so its share goes, in proportion, to the others."""
    kept_groups = {g: n for g, n in kept.items() if n > 0}
    launched_share = shares({g: launched.get(g, 0) for g in kept_groups})  # over groups that can be restored
    kept_share = shares(kept_groups)
    if not any(launched_share.values()):  # none of the kept groups was launched: nothing to restore
        return {g: 1.0 for g in kept_groups}
    # sum over kept of w = K * sum_g launched_share[g] = K: the mean weight is 1 by construction.
    return {g: launched_share[g] / kept_share[g] for g in kept_groups}


def effective_sample_size(weights: Sequence[float]) -> float:
    """Kish's effective sample size, (sum w)^2 / sum w^2: how many unweighted trials the weighted
    batch is worth (equal weights: all of them)."""
    square_sum = sum(w * w for w in weights)
    return sum(weights) ** 2 / square_sum if square_sum else 0.0


def launch_count(batch: int, launched: int = PUBLISHED_LAUNCHED, per_batch: int = PUBLISHED_BATCH) -> int:
    """Trials to launch for a batch of ``batch``: the published ratio (560 for 512), rounded up."""
    if batch < 1:
        raise ConfigError(f"the batch size must be at least 1, got {batch}")
    return -(-batch * launched // per_batch)


def pacing_seconds(n: int, windows: Sequence[Window]) -> float:
    """Seconds from the first creation grant to the ``n``-th under the pacing windows, starting
    with an empty history and every request waiting from time 0 (6/s: 560 grants take 93 s)."""
    history: list[float] = []
    now = 0.0
    for _ in range(n):
        now = next_grant_time(history, windows, now)
        history.append(now)
    return history[-1] if history else 0.0


def step_lower_bound(pacing: float, kept_durations: Iterable[float]) -> float:
    """A step cannot be shorter than pacing alone needs to create its trials, nor than its longest
    kept trial."""
    return max([pacing, *kept_durations])


def simulated_finish(works: Sequence[float], slots: int) -> list[float]:
    """When each trial would finish on a clock the run controls: trials start in the given order
    (launch order), each on the first of ``slots`` slots to come free (ties: the lowest slot), and
    run for their work (``works[i]`` units, e.g. tokens sampled and commands run). The scheduler's
    ``clock="work"`` keeps the first B by these times instead of the wall clock's."""
    if slots < 1:
        raise ConfigError(f"at least one slot is needed, got {slots}")
    free = [(0.0, slot) for slot in range(slots)]  # (time the slot comes free, slot), a heap
    finish: list[float] = []
    for work in works:
        start, slot = heapq.heappop(free)
        finish.append(start + max(work, 0.0))
        heapq.heappush(free, (finish[-1], slot))
    return finish


def first_to_finish(finish: Sequence[float], count: int) -> list[int]:
    """Indices of the ``count`` earliest of ``finish``, earliest first; ties go to the lower index
    (the earlier launch), so the choice depends on nothing but the numbers."""
    return sorted(range(len(finish)), key=lambda i: (finish[i], i))[: max(count, 0)]


@dataclass(frozen=True)
class BiasReport:
    """Launched against kept, per group, for one step or cumulatively."""

    groups: dict[str, Tally]
    launched_share: dict[str, float]
    kept_share: dict[str, float]
    weighted_share: dict[str, float]  # kept share under importance weights (= kept share if none)
    tv_distance: float
    tv_distance_weighted: float
    mean_seconds_launched: float
    mean_seconds_kept: float
    mean_turns_launched: float
    mean_turns_kept: float
    totals: Tally = field(default_factory=Tally)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["groups"] = {
            name: {
                **asdict(t),
                "launched_share": self.launched_share[name],
                "kept_share": self.kept_share[name],
                "weighted_share": self.weighted_share[name],
            }
            for name, t in self.groups.items()
        }
        for redundant in ("launched_share", "kept_share", "weighted_share"):
            del data[redundant]
        return data

    def longest(self) -> str | None:
        """The group whose launched trials ran longest on average (observed durations)."""
        means = {g: t.launched_seconds / t.launched for g, t in self.groups.items() if t.launched}
        return max(means, key=means.__getitem__) if means else None


def bias_report(groups: Mapping[str, Tally]) -> BiasReport:
    totals = Tally()
    for name in Tally.__dataclass_fields__:
        setattr(totals, name, sum(getattr(t, name) for t in groups.values()))
    launched = shares({g: t.launched for g, t in groups.items()})
    kept = shares({g: t.kept for g, t in groups.items()})
    weighted = shares({g: t.kept_weight for g, t in groups.items()})
    return BiasReport(
        groups=dict(groups),
        launched_share=launched,
        kept_share=kept,
        weighted_share=weighted,
        tv_distance=total_variation(launched, kept),
        tv_distance_weighted=total_variation(launched, weighted),
        mean_seconds_launched=_mean(totals.launched_seconds, totals.launched),
        mean_seconds_kept=_mean(totals.kept_seconds, totals.kept),
        mean_turns_launched=_mean(totals.launched_turns, totals.launched),
        mean_turns_kept=_mean(totals.kept_turns, totals.kept),
        totals=totals,
    )


def _mean(total: float, count: int) -> float:
    return total / count if count else math.nan


# -- presentation (plain strings, so the CLI, the trainer's log and the benchmark share them) ---------

TABLE_COLUMNS = (
    "family",
    "launched",
    "finished",
    "kept",
    "cancelled",
    "failed",
    "carried",
    "launched %",
    "kept %",
    "weighted %",
    "kept s (mean)",
    "launched s (mean)",
)


def table_rows(report: BiasReport) -> list[tuple[str, ...]]:
    """One row per group (then a total row) under ``TABLE_COLUMNS``."""
    rows: list[tuple[str, ...]] = []
    for name, t in report.groups.items():
        rows.append(
            (
                name,
                str(t.launched),
                str(t.finished),
                str(t.kept),
                str(t.cancelled),
                str(t.failed),
                str(t.carried),
                _pct(report.launched_share[name]),
                _pct(report.kept_share[name]),
                _pct(report.weighted_share[name]),
                _secs(_mean(t.kept_seconds, t.kept)),
                _secs(_mean(t.launched_seconds, t.launched)),
            )
        )
    t = report.totals
    rows.append(
        (
            "all",
            str(t.launched),
            str(t.finished),
            str(t.kept),
            str(t.cancelled),
            str(t.failed),
            str(t.carried),
            "100.0",
            "100.0",
            "100.0",
            _secs(report.mean_seconds_kept),
            _secs(report.mean_seconds_launched),
        )
    )
    return rows


def summary_line(step: int, mode: str, report: BiasReport, cumulative: BiasReport, wall: float, bound: float) -> str:
    """The one-line per-step summary: counts, wall time against its bound, the bias."""
    t = report.totals
    parts = [
        f"step {step} · {mode} · kept {t.kept} · launched {t.launched} · cancelled {t.cancelled}"
        f" · failed {t.failed} · carried {t.carried}",
        f"wall {wall:.0f}s (bound {bound:.0f}s, x{wall / bound if bound else math.nan:.2f})",
        f"TV {report.tv_distance:.3f} (weighted {report.tv_distance_weighted:.3f}, run {cumulative.tv_distance:.3f})",
    ]
    longest = cumulative.longest()
    if longest is not None and longest in report.groups:
        parts.append(
            f"{longest} {_pct(report.launched_share[longest])}% launched → {_pct(report.kept_share[longest])}% kept"
            + (
                ""
                if report.weighted_share == report.kept_share
                else f" ({_pct(report.weighted_share[longest])}% weighted)"
            )
        )
    parts.append(f"mean s kept/launched {_secs(report.mean_seconds_kept)}/{_secs(report.mean_seconds_launched)}")
    return " · ".join(parts)


def _pct(share: float) -> str:
    return f"{100 * share:.1f}"


def _secs(seconds: float) -> str:
    return "-" if math.isnan(seconds) else f"{seconds:.0f}" if seconds >= 100 else f"{seconds:.1f}"
