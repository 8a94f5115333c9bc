"""Choose which of a verifier's outputs to grade, and parse it without ever raising.

Order (the first source that is present wins, whether or not it parses):
    1. `ctrf.json`
    2. every `*.xml` file (JUnit), sorted by name, aggregated
    3. every `*.tap` file (TAP), sorted by name, aggregated
    4. the pytest `-rA` short test summary in the verifier's output
    5. `reward.json`
    6. `reward.txt`
    7. the verifier's exit code
An unusable first source (malformed, wrong structure, unsafe XML, over `MAX_REPORT_BYTES`,
undecodable) yields a report of that format with no assertions and
`error="unparseable report <file>: <reason>"`; it never falls through to a later source, so a
broken `ctrf.json` cannot become a pass by exit code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from verifiers.ctrf import parse_ctrf
from verifiers.junit import parse_junit
from verifiers.pytest_summary import parse_pytest_summary
from verifiers.report import Assertion, AssertionReport, ReportFormat, ReportParseError
from verifiers.reward_files import from_exit_code, parse_reward_json, parse_reward_txt
from verifiers.tap import parse_tap

MAX_REPORT_BYTES = 4 * 1024 * 1024
NO_RESULT = "verifier produced no result"
_MAX_REASON_CHARS = 500

# One file's bytes -> its report; raises ReportParseError when the file is unusable.
_FileParser = Callable[[bytes, str], AssertionReport]


def select_report(files: Mapping[str, bytes], verifier_output: str, exit_code: int | None) -> AssertionReport:
    """Grade the first available source in the module's order; never raises for any file content.

    `files` maps the names of the files at the top level of the verifier's log directory to their
    content (names holding a path separator, and non-str names, are ignored). `exit_code` is None
    when it is unknown; if no other source exists either, the result is an exit-code report with
    one failed assertion and `error="verifier produced no result"`.
    Raises ValueError only for arguments of the wrong type (not a Mapping, not a str, not an int).
    """
    if not isinstance(files, Mapping):
        raise ValueError(f"files must be a Mapping, not {type(files).__name__}")
    if not isinstance(verifier_output, str):
        raise ValueError(f"verifier_output must be a str, not {type(verifier_output).__name__}")
    if exit_code is not None and (isinstance(exit_code, bool) or not isinstance(exit_code, int)):
        raise ValueError(f"exit_code must be an int or None, not {type(exit_code).__name__}")

    names = sorted(name for name in files if isinstance(name, str) and "/" not in name and "\\" not in name)
    if "ctrf.json" in names:
        return _from_files("ctrf", files, ["ctrf.json"], _ctrf)
    xml = [name for name in names if name.endswith(".xml")]
    if xml:
        return _from_files("junit", files, xml, _junit)
    tap = [name for name in names if name.endswith(".tap")]
    if tap:
        return _from_files("tap", files, tap, _tap)
    summary = _pytest_summary(verifier_output)
    if summary is not None:
        return summary
    if "reward.json" in names:
        return _from_files("reward-file", files, ["reward.json"], _reward_json)
    if "reward.txt" in names:
        return _from_files("reward-file", files, ["reward.txt"], _reward_txt)
    if exit_code is not None:
        return from_exit_code(exit_code)
    return AssertionReport(
        format="exit-code",
        assertions=(Assertion(name="exit code", status="failed", message=NO_RESULT),),
        binary=True,
        source="exit code",
        error=NO_RESULT,
    )


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
        except Exception as exc:  # noqa: BLE001 - the no-raise guarantee holds even if a parser has a bug
            return _unparseable(format, binary, source, name, f"internal parser error: {type(exc).__name__}: {exc}")
        assertions.extend(report.assertions)
    return AssertionReport(format=format, assertions=tuple(assertions), binary=binary, source=source)


def _content(value: object) -> bytes:
    if isinstance(value, str):
        value = value.encode("utf-8", errors="replace")
    elif isinstance(value, (bytearray, memoryview)):
        value = bytes(value)
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
    except Exception as exc:  # noqa: BLE001 - documented never to raise; guard the guarantee anyway
        return _unparseable("pytest", False, source, source, f"internal parser error: {type(exc).__name__}: {exc}")
