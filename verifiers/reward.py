"""The reward an episode earns from its verifier report.

- A report with `error` set earns 0.0.
- A binary report (reward file, exit code) earns 1.0 when resolved, else 0.0.
- A per-assertion report earns `passed / scale`: every passing assertion is worth 1/scale,
  whatever else failed. It is deliberately neither a pass ratio nor capped at 1: a task with
  more than `scale` passing assertions earns more than 1.0 (25 passed at scale 20 -> 1.25).
  Skipped assertions earn nothing and cost nothing.
"""

# Arguments are checked at run time too (callers need not be type-checked); strict pyright, which
# trusts the annotations, would call those isinstance checks unnecessary.
# pyright: reportUnnecessaryIsInstance=false

from __future__ import annotations

from .report import AssertionReport

DEFAULT_SCALE = 20


def compute_reward(report: AssertionReport, scale: int = DEFAULT_SCALE) -> float:
    """Reward for `report` (see the module docstring); always a finite float >= 0.

    Raises ValueError when `report` is not an AssertionReport or `scale` is not a positive int.
    """
    if not isinstance(report, AssertionReport):
        raise ValueError(f"report must be an AssertionReport, not {type(report).__name__}")
    if isinstance(scale, bool) or not isinstance(scale, int) or scale <= 0:
        raise ValueError(f"scale must be a positive int, not {scale!r}")
    if report.error is not None:
        return 0.0
    if report.binary:
        return 1.0 if report.resolved else 0.0
    return report.passed / scale
