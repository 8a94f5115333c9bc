"""Parse the "short test summary info" section that `pytest -rA` prints.

This is how Terminal-Bench 1 grades tasks: the verifier's stdout is read, not a report file.
Only the section after the LAST `=== short test summary info ===` banner is read, up to the
closing `=== 2 failed, 3 passed in 0.12s ===` line (any `=...=` line ends it). ANSI colour
codes are removed first.

Line mapping (the name is the pytest node id, e.g. `tests/test_outputs.py::test_x[param]`):
    PASSED nodeid                     -> passed
    FAILED nodeid - message           -> failed
    ERROR nodeid - message            -> failed
    SKIPPED [N] path:line: reason     -> skipped, named `path:line` (one assertion per line,
                                         even when pytest folded N skips into it)
    XFAIL nodeid - reason             -> passed (as Terminal-Bench 1 counts it)
    XPASS nodeid [- reason]           -> failed
Lines starting with none of these words continue the previous assertion's message when that
assertion failed (pytest -vv prints multi-line messages) and are otherwise ignored.

Guarantees: never raises for str input; returns None exactly when there is no banner.
"""

# Arguments are checked at run time too (callers need not be type-checked); strict pyright, which
# trusts the annotations, would call those isinstance checks unnecessary.
# pyright: reportUnnecessaryIsInstance=false

from __future__ import annotations

import re

from .report import MAX_MESSAGE_CHARS, Assertion, AssertionReport, Status

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_BANNER = re.compile(r"=+ short test summary info =+")
_CLOSING = re.compile(r"=+ .* =+|=+")
_WORD = re.compile(r"(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (.*)")
# A node id runs to the first space, unless it has a parameter part "[...]", which may contain
# spaces; the parameter part ends at the first "]" followed by a space or the end of the line.
_NODE = re.compile(r"([^\s\[]+(?:\[.*?\](?=\s|$))?)(?:\s+-\s+(.*)|\s+(.*))?")
_SKIP = re.compile(r"(?:\[\d+\]\s+)?(?:(.+?:\d+): (.*)|(.+?)(?:: (.*))?)")
_STATUS: dict[str, Status] = {
    "PASSED": "passed",
    "FAILED": "failed",
    "ERROR": "failed",
    "XFAIL": "passed",
    "XPASS": "failed",
}


def parse_pytest_summary(text: str, source: str = "verifier output") -> AssertionReport | None:
    """Parse the last pytest `-rA` short test summary in `text`; None when there is none."""
    if not isinstance(text, str):
        return None
    lines = _ANSI.sub("", text).splitlines()
    start = None
    for index in range(len(lines) - 1, -1, -1):
        if _BANNER.fullmatch(lines[index].strip()):
            start = index + 1
            break
    if start is None:
        return None
    assertions: list[Assertion] = []
    for raw in lines[start:]:
        line = raw.rstrip()
        if _CLOSING.fullmatch(line.strip()):
            break
        match = _WORD.fullmatch(line)
        if match is None:
            _continue_message(assertions, line)
            continue
        word, rest = match.groups()
        if word == "SKIPPED":
            assertions.append(_skipped(rest))
        else:
            assertions.append(_outcome(_STATUS[word], rest))
    return AssertionReport(format="pytest", assertions=tuple(assertions), binary=False, source=source)


def _outcome(status: Status, rest: str) -> Assertion:
    node = _NODE.fullmatch(rest.strip())
    if node is None:  # unreachable for non-empty text, kept as a safe fallback
        return Assertion(name=rest.strip(), status=status)
    name, dashed, plain = node.groups()
    message = (dashed if dashed is not None else plain) or ""
    return Assertion(name=name, status=status, message=message.strip())


def _skipped(rest: str) -> Assertion:
    match = _SKIP.fullmatch(rest.strip())
    if match is None:
        return Assertion(name=rest.strip(), status="skipped")
    location, reason, other, other_reason = match.groups()
    if location is not None:
        return Assertion(name=location, status="skipped", message=reason.strip())
    return Assertion(name=(other or "").strip(), status="skipped", message=(other_reason or "").strip())


def _continue_message(assertions: list[Assertion], line: str) -> None:
    if not assertions or assertions[-1].status != "failed" or not line.strip():
        return
    if len(assertions[-1].message) >= MAX_MESSAGE_CHARS:
        return  # already full: Assertion would cut anything appended
    last = assertions[-1]
    message = f"{last.message}\n{line.strip()}" if last.message else line.strip()
    assertions[-1] = Assertion(name=last.name, status=last.status, message=message)
