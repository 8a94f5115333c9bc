"""A run's evaluation summary from its trial records (pure): the resolved rate with a 95% Wilson
interval, the unbiased pass@k for every k up to the trials per task, the mean reward and the mean
fraction of assertions passed, overall and per family, plus stop reasons, parse errors and usage.

Trials whose record carries an infrastructure error (``INFRASTRUCTURE``: the sandbox, the image
build or the model's server failed) say nothing about the agent: they are counted apart
(``excluded``) and left out of every rate. ``termgym run --resume`` runs them again.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

INFRASTRUCTURE = ("sandbox_error", "build_failed", "model_error")
Z_95 = 1.959963984540054


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased estimate of pass@k from ``n`` trials of which ``c`` resolved (Chen et al. 2021):
    ``1 - C(n - c, k) / C(n, k)``; needs ``1 <= k <= n``."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion ((0, 1) for no trials)."""
    if trials == 0:
        return 0.0, 1.0
    p = successes / trials
    centre = p + z * z / (2 * trials)
    spread = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials))
    scale = 1 + z * z / trials
    return max(0.0, (centre - spread) / scale), min(1.0, (centre + spread) / scale)


def is_scored(record: Mapping[str, Any]) -> bool:
    error = record.get("error")
    return not (error and error.get("kind") in INFRASTRUCTURE)


def summarize(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The summary of ``records`` (trial records as dicts), overall and per family."""
    scored = [r for r in records if is_scored(r)]
    excluded = Counter(r["error"]["kind"] for r in records if not is_scored(r))
    families: dict[str, list[Mapping[str, Any]]] = {}
    for record in scored:
        families.setdefault(record.get("family") or "-", []).append(record)
    usage = Counter()
    for record in records:
        usage.update({k: v for k, v in (record.get("usage") or {}).items() if isinstance(v, int)})
    return {
        "records": len(records),
        "scored": len(scored),
        "excluded": dict(sorted(excluded.items())),
        **_rates(scored),
        "families": {family: _rates(group) for family, group in sorted(families.items())},
        "stop_reasons": dict(Counter(r.get("stop_reason") or "-" for r in records).most_common()),
        "errors": dict(Counter(r["error"]["kind"] for r in records if r.get("error")).most_common()),
        "parse_errors": sum(int(r.get("parse_errors") or 0) for r in records),
        "usage": dict(usage),
    }


def _rates(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    resolved = sum(bool(r.get("resolved")) for r in records)
    low, high = wilson_interval(resolved, len(records))
    by_task: dict[str, list[bool]] = {}
    for record in records:
        by_task.setdefault(record["task"], []).append(bool(record.get("resolved")))
    fractions = [r["passed"] / r["total"] for r in records if r.get("total")]
    return {
        "tasks": len(by_task),
        "trials": len(records),
        "resolved": resolved,
        "resolved_rate": resolved / len(records) if records else 0.0,
        "resolved_ci95": [low, high],
        "pass_at_k": pass_at_k_table(by_task.values()),
        "mean_reward": sum(float(r.get("reward") or 0.0) for r in records) / len(records) if records else 0.0,
        "mean_assertions_passed": sum(fractions) / len(fractions) if fractions else 0.0,
    }


def pass_at_k_table(outcomes: Iterable[Sequence[bool]]) -> dict[str, float]:
    """``{"1": ..., "K": ...}``: pass@k averaged over tasks, for every k up to the fewest trials
    any task has (so each k averages over every task)."""
    groups = [list(g) for g in outcomes if g]
    if not groups:
        return {}
    fewest = min(len(g) for g in groups)
    return {str(k): sum(pass_at_k(len(g), sum(g), k) for g in groups) / len(groups) for k in range(1, fewest + 1)}
