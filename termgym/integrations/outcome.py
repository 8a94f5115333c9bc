"""An ended episode's outcome as one flat dict, what a framework reports of it (SkyRL's final step
metadata, inspect's score): ``resolved`` (1 or 0), ``reward`` (passed / S), ``passed``, ``total``,
``assertions``, ``stop_reason``, ``error``, ``warnings`` and the verifier output's tail. A pure
function of the final step's reward and info and the episode's stop reason."""

from __future__ import annotations

from typing import Any


def outcome(reward: float, info: dict[str, Any], stop_reason: str | None) -> dict[str, Any]:
    """The outcome of the episode whose final step gave ``reward`` and ``info`` (an episode that
    ended on a fault has no assertions: 0 of 0, its error set)."""
    return {
        "resolved": int(bool(info.get("resolved"))),
        "reward": float(reward),
        "passed": info.get("passed", 0),
        "total": info.get("total", 0),
        "assertions": info.get("assertions", []),
        "stop_reason": stop_reason,
        "error": info.get("error"),
        "warnings": info.get("warnings", []),
        "verifier_output": info.get("verifier_output", ""),
    }
