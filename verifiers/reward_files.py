"""Binary reports: Harbor's reward files (`reward.json`, `reward.txt`) and a bare exit code.

These carry no per-assertion detail, so each yields exactly one assertion and `binary=True`.
The binary rule for reward files: a reward >= 1.0 passes, anything lower fails.

Guarantees: the parsers return a report with exactly one assertion or raise ReportParseError,
nothing else, for str input; non-finite numbers (NaN, Infinity) are always parse errors.
"""

# Arguments are checked at run time too (callers need not be type-checked); strict pyright, which
# trusts the annotations, would call those isinstance checks unnecessary.
# pyright: reportUnnecessaryIsInstance=false

from __future__ import annotations

import math
import re

from .jsonsafe import is_object, json_kind, load_json
from .report import Assertion, AssertionReport, ReportParseError

_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def parse_reward_json(text: str, source: str = "reward.json") -> AssertionReport:
    """Parse Harbor's `reward.json`: a flat JSON object whose values are all numbers.

    The reward is the value of key `reward` when present, else the mean of all values.
    Raises ReportParseError when the text is not a JSON object, is empty, has a value that is
    not a number (strings, booleans, nested objects...), or the reward is not finite.
    """
    data = load_json(text)
    if not is_object(data):
        raise ReportParseError(f"top level is a JSON {json_kind(data)}, expected an object")
    if not data:
        raise ReportParseError("no numeric values")
    values: dict[str, float] = {}
    for key, value in data.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ReportParseError(f"value of {key[:100]!r} is a JSON {json_kind(value)}, expected a number")
        values[key] = _finite(value, key)
    if "reward" in values:
        reward = values["reward"]
    else:
        # Dividing first keeps every partial sum within the range of the values: no overflow.
        reward = math.fsum(value / len(values) for value in values.values())
    return _binary_report(_finite(reward, "mean"), source)


def parse_reward_txt(text: str, source: str = "reward.txt") -> AssertionReport:
    """Parse `reward.txt`: a single decimal number, surrounding whitespace allowed.

    Raises ReportParseError for anything else (empty text, words, `nan`, `inf`, two numbers).
    """
    if not isinstance(text, str):
        raise ReportParseError(f"expected text, got {type(text).__name__}")
    stripped = text.strip()
    if not _NUMBER.fullmatch(stripped):
        raise ReportParseError(f"not a single number: {stripped[:50]!r}")
    return _binary_report(_finite(stripped, "reward"), source)


def from_exit_code(code: int) -> AssertionReport:
    """Report for a verifier that left only its exit code: 0 passes, anything else fails.

    The failed assertion's message is `exit N`. Raises ValueError when `code` is not an int.
    """
    if isinstance(code, bool) or not isinstance(code, int):
        raise ValueError(f"exit code must be an int, not {type(code).__name__}")
    if code == 0:
        assertion = Assertion(name="exit code", status="passed")
    else:
        assertion = Assertion(name="exit code", status="failed", message=f"exit {code}")
    return AssertionReport(format="exit-code", assertions=(assertion,), binary=True, source="exit code")


def _finite(value: int | float | str, what: str) -> float:
    try:
        number = float(value)
    except (OverflowError, ValueError):
        raise ReportParseError(f"{what[:100]!r} is not a representable number") from None
    if not math.isfinite(number):
        raise ReportParseError(f"{what[:100]!r} is not finite")
    return number


def _binary_report(reward: float, source: str) -> AssertionReport:
    if reward >= 1.0:
        assertion = Assertion(name="reward", status="passed")
    else:
        assertion = Assertion(name="reward", status="failed", message=f"reward {reward:g} < 1")
    return AssertionReport(format="reward-file", assertions=(assertion,), binary=True, source=source)
