"""Parse TAP (Test Anything Protocol) versions 12, 13 and 14.

Read: test points (`ok` / `not ok`, optional number, optional `- description`, `# SKIP` and
`# TODO` directives, case-insensitive), the plan `1..N` (at the start or the end) and
`Bail out!`. Ignored: the version line, comments, pragmas, and every indented line (subtests
and YAML diagnostic blocks), plus anything unrecognised.

Guarantees: returns a `tap` report, or raises `ReportParseError`; nothing else for str input.
- `# SKIP` and `# TODO` test points are skipped (they count neither way), whatever their ok-ness;
- with a plan, every planned number never reported becomes a failed assertion
  `missing test N` (after a bail out, its message gives the bail-out reason); more tests than
  planned adds one failed assertion `plan` (the run did not match its plan);
- without a plan, a bail out adds one failed assertion `bail out`;
- a text with no test point, no plan and no bail out raises ReportParseError, and so do two
  plans or a plan or test number above 100000.
"""

# Arguments are checked at run time too (callers need not be type-checked); strict pyright, which
# trusts the annotations, would call those isinstance checks unnecessary.
# pyright: reportUnnecessaryIsInstance=false

from __future__ import annotations

import re
from dataclasses import dataclass

from .report import Assertion, AssertionReport, ReportParseError

_TEST = re.compile(r"(not ok|ok)\b[ \t]*(\d+)?[ \t]*(?:-[ \t]*)?(.*)")
_PLAN = re.compile(r"1\.\.(\d+)[ \t]*(?:#.*)?")
_BAIL = re.compile(r"Bail out!(.*)", re.IGNORECASE)
_DIRECTIVE = re.compile(r"(?<!\\)#[ \t]*(skip\S*|todo\b)[ \t:]*(.*)$", re.IGNORECASE)
_MAX_NUMBER = 100_000  # bounds the plan and test numbers: `1..999999999` must not allocate a billion assertions


@dataclass
class _Point:
    number: int
    assertion: Assertion


def parse_tap(text: str, source: str = "") -> AssertionReport:
    """Parse a TAP stream into one assertion per test point (see the module docstring)."""
    if not isinstance(text, str):
        raise ReportParseError(f"expected text, got {type(text).__name__}")
    points: list[_Point] = []
    plan: int | None = None
    bail_reason: str | None = None
    next_number = 1
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line or line[0] in " \t":
            continue  # blank, subtest or YAML diagnostic block
        test = _TEST.fullmatch(line)
        if test is not None:
            number = _bounded(test.group(2), "test number") if test.group(2) else next_number
            points.append(_Point(number, _assertion(test.group(1) == "ok", number, test.group(3))))
            next_number = number + 1
            continue
        planned = _PLAN.fullmatch(line)
        if planned is not None:
            if plan is not None:
                raise ReportParseError("more than one plan line")
            plan = _bounded(planned.group(1), "plan")
            continue
        bail = _BAIL.match(line)
        if bail is not None:
            bail_reason = bail.group(1).strip()
            break
    if not points and plan is None and bail_reason is None:
        raise ReportParseError("no TAP test line or plan found")
    assertions = [point.assertion for point in points]
    assertions.extend(_plan_failures(plan, points, bail_reason))
    return AssertionReport(format="tap", assertions=tuple(assertions), binary=False, source=source)


def _assertion(ok: bool, number: int, rest: str) -> Assertion:
    description = rest.strip()
    directive = _DIRECTIVE.search(description)
    if directive is not None:
        reason = (directive.group(2) or "").strip()
        description = description[: directive.start()].strip()
        kind = "SKIP" if directive.group(1).lower().startswith("skip") else "TODO"
        name = _unescape(description) or f"test {number}"
        return Assertion(name=name, status="skipped", message=f"{kind}: {reason}" if reason else kind)
    name = _unescape(description) or f"test {number}"
    if ok:
        return Assertion(name=name, status="passed")
    return Assertion(name=name, status="failed", message=f"not ok {number}")


def _plan_failures(plan: int | None, points: list[_Point], bail_reason: str | None) -> list[Assertion]:
    if plan is None:
        if bail_reason is None:
            return []
        return [Assertion(name="bail out", status="failed", message=bail_reason or "Bail out!")]
    seen = {point.number for point in points}
    if bail_reason is not None:
        why = f"not run: bailed out ({bail_reason})" if bail_reason else "not run: bailed out"
    else:
        why = "planned but not run"
    failures: list[Assertion] = []
    for number in range(1, plan + 1):
        if number not in seen:
            failures.append(Assertion(name=f"missing test {number}", status="failed", message=why))
    if len(points) > plan:
        failures.append(Assertion(name="plan", status="failed", message=f"ran {len(points)} tests, planned {plan}"))
    return failures


def _bounded(digits: str, what: str) -> int:
    if len(digits) > len(str(_MAX_NUMBER)) or int(digits) > _MAX_NUMBER:
        raise ReportParseError(f"{what} {digits[:20]} is larger than {_MAX_NUMBER}")
    return int(digits)


def _unescape(text: str) -> str:
    return text.replace("\\#", "#").replace("\\\\", "\\")
