"""Strict JSON loading shared by the JSON report parsers.

Guarantees: `load_json` returns the decoded value or raises `ReportParseError`; it never raises
anything else for a `str` input (deep nesting, huge integers and the non-standard constants
NaN/Infinity/-Infinity are all reported as parse errors).
"""

# Arguments are checked at run time too (callers need not be type-checked); strict pyright, which
# trusts the annotations, would call those isinstance checks unnecessary.
# pyright: reportUnnecessaryIsInstance=false

from __future__ import annotations

import json
from typing import Any, TypeGuard

from .report import ReportParseError


def _reject_constant(name: str) -> Any:
    raise ReportParseError(f"non-standard JSON constant {name}")


def load_json(text: str) -> Any:
    """Decode `text` as strict JSON; raise ReportParseError on anything else."""
    if not isinstance(text, str):
        raise ReportParseError(f"expected text, got {type(text).__name__}")
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ReportParseError:
        raise
    except RecursionError:
        raise ReportParseError("JSON nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and int() refusing an over-long integer
        raise ReportParseError(f"invalid JSON: {exc}") from None


def is_object(value: object) -> TypeGuard[dict[str, object]]:
    """True for a decoded JSON object (its keys are always strings)."""
    return isinstance(value, dict)


def is_array(value: object) -> TypeGuard[list[object]]:
    """True for a decoded JSON array."""
    return isinstance(value, list)


def json_kind(value: Any) -> str:
    """The JSON type name of a decoded value ("object", "array", "string", ...)."""
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"
