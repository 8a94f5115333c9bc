"""The trainer's metrics in TensorBoard or W&B (``termgym train --track``), written through
``termgym.tracking``.

Every PPO step: every number of the step's ``metrics.jsonl`` object (``step_scalars``). A
top-level metric goes under its section, CleanRL's habit (``charts/reward``,
``losses/explained_variance``, ``losses/clip_fraction``, ``consistency/token_drift``,
``timings/rollout_seconds``; one not in ``SECTIONS`` under ``train/``); a nested one under its own
path (the scheduler's accounting: ``scheduler/families/tv_distance``, the straggler bias, and each
family's counts). The x axis counts the steps done (the first step is 1), as the progress line and
the plots do. At the end of a ``--pool`` run: the held-out results of each evaluation, overall and
per family (``heldout_scalars``), the per-family table (``heldout_table``) and the job's own figures
(``job_scalars``: sizes, the start check, phase timings, the supervised loss), at the last step.
The run's configuration is its hyperparameters.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from termgym.tracking import Tracker, flatten, open_tracker

from .config import Config
from .evaluate import EvalSummary

SECTIONS: dict[str, str] = {
    **dict.fromkeys(
        (
            "reward",
            "resolved",
            "passed",
            "turns",
            "reward_std",
            "equal_reward_share",
            "equal_reward_families",
            "warmup",
        ),
        "charts",
    ),
    **dict.fromkeys(
        (
            "policy_loss",
            "value_loss",
            "explained_variance",
            "clip_fraction",
            "approx_kl",
            "entropy",
            "kl_to_reference",
        ),
        "losses",
    ),
    # training against inference: TITO's token drift, R3's routing, the sampler's staleness and weights
    **dict.fromkeys(
        (
            "logprob_gap",
            "token_drift",
            "routing_replay",
            "routing_agreement",
            "routing_recorded",
            "publication_gap",
            "staleness_max",
            "staleness_mean",
        ),
        "consistency",
    ),
    **dict.fromkeys(
        (
            "tokens",
            "action_tokens",
            "bridge_break_rate",
            "segments_per_episode",
            "parse_error_rate",
            "context_exhausted",
            "compactions",
            "compaction_failures",
        ),
        "episodes",
    ),
    **dict.fromkeys(
        ("rollout_seconds", "update_seconds", "update_tokens_per_second", "generation_batch_mean"), "timings"
    ),
}


def step_scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """Pure: one step's metrics (a ``metrics.jsonl`` object) as tracked scalars (the module's
    docstring); ``step`` itself is the x axis, not a scalar."""
    scalars: dict[str, float] = {}
    for key, value in metrics.items():
        if key == "step":
            continue
        if isinstance(value, Mapping):
            scalars.update(flatten(value, key))
        else:
            scalars.update(flatten({key: value}, SECTIONS.get(key, "train")))
    return scalars


SUMMARY_FIELDS = ("resolved", "passed", "passed_share", "reward", "errors")


def heldout_scalars(evaluations: Mapping[str, EvalSummary]) -> dict[str, float]:
    """Pure: each evaluation's held-out results (label -> summary), overall
    (``heldout/LABEL/resolved``) and per family (``heldout/LABEL/families/FAMILY/resolved``)."""
    scalars: dict[str, float] = {}
    for label, summary in evaluations.items():
        scalars.update(flatten({name: getattr(summary, name) for name in SUMMARY_FIELDS}, f"heldout/{label}"))
        scalars.update(flatten(summary.families, f"heldout/{label}/families"))
    return scalars


def heldout_table(evaluations: Mapping[str, EvalSummary]) -> tuple[list[str], list[list[Any]]]:
    """Pure: the per-family table the run prints: a row per family of the first evaluation (its
    task count, then each evaluation's resolved rate; NaN where an evaluation lacks the family)."""
    first = next(iter(evaluations.values()), None)
    families = first.families if first is not None else {}
    columns = ["family", "tasks", *(f"{label}: resolved" for label in evaluations)]
    rows = [
        [
            family,
            int(counts["tasks"]),
            *(s.families.get(family, {}).get("resolved", float("nan")) for s in evaluations.values()),
        ]
        for family, counts in families.items()
    ]
    return columns, rows


def job_scalars(summary: Mapping[str, Any], sft_losses: Sequence[float]) -> dict[str, float]:
    """Pure: a ``--pool`` job's own figures beside its held-out ones: every number of its
    ``summary.json`` but the held-out results (the pool, the accepted tasks, the demonstrations,
    the parameters, the start check, each phase's seconds) under ``job/``, and the supervised
    start's first and last loss (``job/sft_loss/first``, ``job/sft_loss/last``)."""
    figures = {key: value for key, value in summary.items() if key != "heldout"}
    if sft_losses:
        figures["sft_loss"] = {"first": sft_losses[0], "last": sft_losses[-1], "steps": len(sft_losses)}
    return flatten(figures, "job")


def log_job(tracker: Tracker | None, summary: Mapping[str, Any], sft_losses: Sequence[float], step: int) -> None:
    """``job_scalars`` at ``step`` (nothing without a tracker)."""
    if tracker is not None:
        tracker.log(job_scalars(summary, sft_losses), step)


def log_heldout(tracker: Tracker | None, evaluations: Mapping[str, EvalSummary], step: int) -> None:
    """The held-out results and the per-family table at ``step`` (nothing without a tracker)."""
    if tracker is None:
        return
    tracker.log(heldout_scalars(evaluations), step)
    tracker.table("heldout/families", *heldout_table(evaluations), step)


@contextlib.contextmanager
def run_tracker(cfg: Config, out: Path, given: Tracker | None = None) -> Iterator[Tracker | None]:
    """``given`` when there is one (a pipeline's, for its PPO phase: one run for the whole job,
    closed by its opener); else with ``cfg.track`` a tracker for the run in ``out``, its
    hyperparameters ``cfg``, closed on the way out; else None."""
    if given is not None or not cfg.track:
        yield given
        return
    with open_tracker(cfg.track, out, dataclasses.asdict(cfg), name=out.name) as tracker:
        yield tracker
