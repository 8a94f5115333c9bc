"""Choose which of a verifier's outputs to grade, and parse it without ever raising.

Order (the first source that is present wins, whether or not it parses): `ctrf.json`, every `*.xml`
(JUnit), every `*.tap` (TAP), `reward.json`, `reward.txt`, the pytest `-rA` short test summary in
the verifier's output, the verifier's exit code. Report files always rank above anything parsed
from the output, which a program the agent wrote can print into. A task that declares its report
format (`declared`) is graded from that source alone: when the verifier did not produce it, the
report has `error` set, whatever else exists.

An unusable first source (malformed, wrong structure, unsafe XML, over `MAX_REPORT_BYTES`,
undecodable) yields a report of that format with no assertions and
`error="unparseable report <file>: <reason>"`; it never falls through to a later source.

`check_assertion_count` holds a per-assertion report to the number of assertions the task's
verifier defines: more is an error (a forged or runaway report cannot amplify the reward), fewer
are completed with failed assertions (a verifier stopped half-way never counts as resolved).
Each source in detail: docs/guides/tasks.md#report-formats."""

# Arguments are checked at run time too (callers need not be type-checked); strict pyright, which
# trusts the annotations, would call those isinstance checks unnecessary.
# pyright: reportUnnecessaryIsInstance=false

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import cast

from .ctrf import parse_ctrf
from .junit import parse_junit
from .pytest_summary import parse_pytest_summary
from .report import (
    BINARY_FORMATS,
    REPORT_FORMATS,
    Assertion,
    AssertionReport,
    ReportFormat,
    ReportParseError,
)
from .reward_files import from_exit_code, parse_reward_json, parse_reward_txt
from .tap import parse_tap

MAX_REPORT_BYTES = 4 * 1024 * 1024
NO_RESULT = "verifier produced no result"
_MAX_REASON_CHARS = 500

# One file's bytes -> its report; raises ReportParseError when the file is unusable.
_FileParser = Callable[[bytes, str], AssertionReport]
# One source in the order: the files, their usable names (sorted), the verifier's output and exit
# code -> its report, or None when the verifier did not produce it.
_Source = Callable[[Mapping[str, object], Sequence[str], str, int | None], AssertionReport | None]


def select_report(
    files: Mapping[str, bytes], verifier_output: str, exit_code: int | None, *, declared: ReportFormat | None = None
) -> AssertionReport:
    """Grade the first available source in the module's order, or the `declared` one alone;
    never raises for any file content.

    `files` maps the names of the files at the top level of the verifier's log directory to their
    content (names holding a path separator, and non-str names, are ignored). `exit_code` is None
    when it is unknown; if no other source exists either, the result is an exit-code report with
    one failed assertion and `error="verifier produced no result"`.
    Raises ValueError only for arguments of the wrong type (not a Mapping, not a str, not an int,
    a `declared` that is not a report format).
    """
    if not isinstance(files, Mapping):
        raise ValueError(f"files must be a Mapping, not {type(files).__name__}")
    if not isinstance(verifier_output, str):
        raise ValueError(f"verifier_output must be a str, not {type(verifier_output).__name__}")
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
        raise ValueError(f"exit_code must be an int or None, not {type(exit_code).__name__}")

    if declared is not None and declared not in REPORT_FORMATS:
        raise ValueError(f"declared must be one of {sorted(REPORT_FORMATS)}, not {declared!r}")

    names = sorted(name for name in files if isinstance(name, str) and "/" not in name and "\\" not in name)
    for format in _ORDER if declared is None else (declared,):
        report = _SOURCES[format](files, names, verifier_output, exit_code)
        if report is not None:
            return report
    if declared is not None:
        what = _DECLARED_SOURCE[declared]
        error = f"the task declares its report as {declared}, but the verifier produced no {what}"
        return AssertionReport(
            format=declared, assertions=(), binary=declared in BINARY_FORMATS, source=what, error=error
        )
    return AssertionReport(
        format="exit-code",
        assertions=(Assertion(name="exit code", status="failed", message=NO_RESULT),),
        binary=True,
        source="exit code",
        error=NO_RESULT,
    )


def check_assertion_count(report: AssertionReport, expected: int | None) -> AssertionReport:
    """`report` held to the `expected` number of counted (passed or failed) assertions.

    Unchanged when `expected` is None, the report is binary or already has an error. A report that
    counts more assertions than expected becomes an error report (no assertions, never resolved,
    reward 0); one that counts fewer gets a failed assertion for each one missing, so it is not
    resolved and its total is `expected`. Raises ValueError for an `expected` below 1.
    """
    if expected is None or report.binary or report.error is not None:
        return report
    if isinstance(expected, bool) or not isinstance(expected, int) or expected < 1:
        raise ValueError(f"expected must be a positive int or None, not {expected!r}")
    if report.total > expected:
        error = f"the report counts {report.total} assertions; the task's verifier defines {expected}"
        return replace(report, assertions=(), error=error)
    missing = tuple(
        Assertion(
            name=f"(assertion {index} of {expected} not reported)", status="failed", message="missing from the report"
        )
        for index in range(report.total + 1, expected + 1)
    )
    return replace(report, assertions=report.assertions + missing) if missing else report


def too_many_files_report(
    counts: Mapping[str, int], limit: int, declared: ReportFormat | None = None
) -> AssertionReport:
    """The error report for a verifier that wrote more report files than termgym reads (`counts`:
    report files per format); its format is the one that would have been graded."""
    present: list[ReportFormat] = [f for f in _ORDER if counts.get(f)] if declared is None else [declared]
    format: ReportFormat = present[0] if present else "exit-code"
    total = sum(counts.values())
    error = f"the verifier wrote {total} report files to its log directory, more than the {limit} termgym reads"
    return AssertionReport(
        format=format, assertions=(), binary=format in BINARY_FORMATS, source="report files", error=error
    )


def report_format_of(name: str) -> ReportFormat | None:
    """The format a file at the top of the verifier's log directory is read as, if any."""
    if name == "ctrf.json":
        return "ctrf"
    if name.endswith(".xml"):
        return "junit"
    if name.endswith(".tap"):
        return "tap"
    if name in ("reward.json", "reward.txt"):
        return "reward-file"
    return None


def _ctrf_source(
    files: Mapping[str, object], names: Sequence[str], output: str, exit_code: int | None
) -> AssertionReport | None:
    return _from_files("ctrf", files, ["ctrf.json"], _ctrf) if "ctrf.json" in names else None


def _junit_source(
    files: Mapping[str, object], names: Sequence[str], output: str, exit_code: int | None
) -> AssertionReport | None:
    xml = [name for name in names if name.endswith(".xml")]
    return _from_files("junit", files, xml, _junit) if xml else None


def _tap_source(
    files: Mapping[str, object], names: Sequence[str], output: str, exit_code: int | None
) -> AssertionReport | None:
    tap = [name for name in names if name.endswith(".tap")]
    return _from_files("tap", files, tap, _tap) if tap else None


def _reward_source(
    files: Mapping[str, object], names: Sequence[str], output: str, exit_code: int | None
) -> AssertionReport | None:
    if "reward.json" in names:
        return _from_files("reward-file", files, ["reward.json"], _reward_json)
    if "reward.txt" in names:
        return _from_files("reward-file", files, ["reward.txt"], _reward_txt)
    return None


def _pytest_source(
    files: Mapping[str, object], names: Sequence[str], output: str, exit_code: int | None
) -> AssertionReport | None:
    return _pytest_summary(output)


def _exit_code_source(
    files: Mapping[str, object], names: Sequence[str], output: str, exit_code: int | None
) -> AssertionReport | None:
    return from_exit_code(exit_code) if exit_code is not None else None


_ORDER: tuple[ReportFormat, ...] = ("ctrf", "junit", "tap", "reward-file", "pytest", "exit-code")
_SOURCES: dict[ReportFormat, _Source] = {
    "ctrf": _ctrf_source,
    "junit": _junit_source,
    "tap": _tap_source,
    "reward-file": _reward_source,
    "pytest": _pytest_source,
    "exit-code": _exit_code_source,
}
_DECLARED_SOURCE = {
    "ctrf": "ctrf.json",
    "junit": "JUnit *.xml file",
    "tap": "TAP *.tap file",
    "reward-file": "reward.json or reward.txt",
    "pytest": "pytest summary in its output",
    "exit-code": "exit code",
}


def _from_files(
    format: ReportFormat, files: Mapping[str, object], names: Sequence[str], parse: _FileParser
) -> AssertionReport:
    """Parse each named file and concatenate the assertions; any failure becomes an error report."""
    source = ", ".join(names)
    binary = format in ("reward-file", "exit-code")
    assertions: list[Assertion] = []
    for name in names:
        try:
            report = parse(_content(files[name]), name)
        except ReportParseError as exc:
            return _unparseable(format, binary, source, name, str(exc))
        except Exception as exc:
            return _unparseable(format, binary, source, name, f"internal parser error: {type(exc).__name__}: {exc}")
        assertions.extend(report.assertions)
    return AssertionReport(format=format, assertions=tuple(assertions), binary=binary, source=source)


def _content(value: object) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8", errors="replace")
    elif isinstance(value, (bytearray, memoryview)):
        value = bytes(cast("bytearray | memoryview[int]", value))  # any format: bytes() copies the raw buffer
    if not isinstance(value, bytes):
        raise ReportParseError(f"content is a {type(value).__name__}, not bytes")
    if len(value) > MAX_REPORT_BYTES:
        raise ReportParseError(f"{len(value)} bytes is over the {MAX_REPORT_BYTES}-byte limit")
    return value


def _unparseable(format: ReportFormat, binary: bool, source: str, name: str, reason: str) -> AssertionReport:
    error = f"unparseable report {name}: {reason[:_MAX_REASON_CHARS]}"
    return AssertionReport(format=format, assertions=(), binary=binary, source=source, error=error)


def _strict_text(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ReportParseError(f"not valid UTF-8 ({exc.reason} at byte {exc.start})") from None


def _lenient_text(data: bytes) -> str:
    return data.decode("utf-8-sig", errors="replace")


def _ctrf(data: bytes, name: str) -> AssertionReport:
    return parse_ctrf(_strict_text(data), source=name)


def _junit(data: bytes, name: str) -> AssertionReport:
    return parse_junit([data], source=name)  # bytes: the parser honours the XML encoding declaration


def _tap(data: bytes, name: str) -> AssertionReport:
    return parse_tap(_lenient_text(data), source=name)


def _reward_json(data: bytes, name: str) -> AssertionReport:
    return parse_reward_json(_strict_text(data), source=name)


def _reward_txt(data: bytes, name: str) -> AssertionReport:
    return parse_reward_txt(_lenient_text(data), source=name)


def _pytest_summary(output: str) -> AssertionReport | None:
    source = "verifier output"
    try:
        return parse_pytest_summary(output, source=source)
    except Exception as exc:
        return _unparseable("pytest", False, source, source, f"internal parser error: {type(exc).__name__}: {exc}")
