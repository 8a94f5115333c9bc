"""The per-assertion report every verifier output is turned into.

Guarantees:
- `Assertion` and `AssertionReport` are immutable and validated at construction: a bad status,
  format or element type raises ValueError, so a report that exists is well formed.
- `Assertion.message` never exceeds `MAX_MESSAGE_CHARS` characters (longer text is cut).
- Skipped assertions count neither way: `total == passed + failed`.
"""

# Arguments are checked at run time too (callers need not be type-checked); strict pyright, which
# trusts the annotations, would call those isinstance checks unnecessary.
# pyright: reportUnnecessaryIsInstance=false

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from termgym.errors import TermgymError

Status = Literal["passed", "failed", "skipped"]
ReportFormat = Literal["ctrf", "junit", "tap", "pytest", "reward-file", "exit-code"]

STATUSES: frozenset[str] = frozenset(get_args(Status))
REPORT_FORMATS: frozenset[str] = frozenset(get_args(ReportFormat))
BINARY_FORMATS: frozenset[str] = frozenset({"reward-file", "exit-code"})
MAX_MESSAGE_CHARS = 1000


class ReportParseError(TermgymError, ValueError):
    """A verifier report could not be parsed: malformed, wrong structure or unsafe (e.g. XML entities)."""


@dataclass(frozen=True)
class Assertion:
    """One checked assertion.

    `name` identifies it (a pytest node id, `classname::name` for JUnit, a TAP description...);
    `message` is the failure message (or skip reason), truncated to `MAX_MESSAGE_CHARS` characters.
    """

    name: str
    status: Status
    message: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise ValueError(f"assertion name must be a str, not {type(self.name).__name__}")
        if self.status not in STATUSES:
            raise ValueError(f"assertion status must be one of {sorted(STATUSES)}, not {self.status!r}")
        if not isinstance(self.message, str):
            raise ValueError(f"assertion message must be a str, not {type(self.message).__name__}")
        if len(self.message) > MAX_MESSAGE_CHARS:
            object.__setattr__(self, "message", self.message[:MAX_MESSAGE_CHARS])

    @property
    def passed(self) -> bool:
        """True exactly when the status is "passed"."""
        return self.status == "passed"


@dataclass(frozen=True)
class AssertionReport:
    """The assertions one verifier report yielded, in report order.

    `binary` is True for formats without per-assertion detail (reward files, exit codes).
    `source` names where the report came from ("ctrf.json", "results.xml", "verifier output",
    "exit code"). `error` is set when the chosen report was unusable; such a report has no
    assertions from the report itself and is never `resolved`.
    """

    format: ReportFormat
    assertions: tuple[Assertion, ...]
    binary: bool
    source: str = ""
    error: str | None = None

    def __post_init__(self) -> None:
        if self.format not in REPORT_FORMATS:
            raise ValueError(f"report format must be one of {sorted(REPORT_FORMATS)}, not {self.format!r}")
        if not isinstance(self.binary, bool):
            raise ValueError("binary must be a bool")
        assertions = tuple(self.assertions)
        for item in assertions:
            if not isinstance(item, Assertion):
                raise ValueError(f"assertions must be Assertion objects, not {type(item).__name__}")
        object.__setattr__(self, "assertions", assertions)
        if not isinstance(self.source, str):
            raise ValueError("source must be a str")
        if self.error is not None and not isinstance(self.error, str):
            raise ValueError("error must be a str or None")

    def _count(self, status: Status) -> int:
        return sum(1 for a in self.assertions if a.status == status)

    @property
    def passed(self) -> int:
        """Number of assertions whose status is "passed"."""
        return self._count("passed")

    @property
    def failed(self) -> int:
        """Number of assertions whose status is "failed"."""
        return self._count("failed")

    @property
    def skipped(self) -> int:
        """Number of assertions whose status is "skipped"."""
        return self._count("skipped")

    @property
    def total(self) -> int:
        """Counted assertions: passed + failed (skipped ones count neither way)."""
        return self.passed + self.failed

    @property
    def resolved(self) -> bool:
        """True when the report is usable, counted at least one assertion and none failed."""
        return self.error is None and self.total > 0 and self.failed == 0
