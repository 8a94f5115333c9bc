"""Parse CTRF JSON (Common Test Report Format, https://ctrf.io).

Only `results.tests[*].name`, `.status` and `.message` are read; every other field is ignored.
Guarantees: returns a `ctrf` report with one assertion per test, in file order, or raises
`ReportParseError`; never any other exception for a `str` input.
"""

from __future__ import annotations

from .jsonsafe import is_array, is_object, json_kind, load_json
from .report import Assertion, AssertionReport, ReportParseError, Status

_STATUS_MAP: dict[str, Status] = {
    "passed": "passed",
    "failed": "failed",
    "skipped": "skipped",
    "pending": "skipped",
}


def parse_ctrf(text: str, source: str = "ctrf.json") -> AssertionReport:
    """Parse a CTRF document.

    Status mapping: passed -> passed, failed -> failed, skipped/pending -> skipped, any other
    string (e.g. "other") -> failed. An empty test list is valid and yields no assertions.
    Raises ReportParseError when the text is not JSON, `results` is not an object, `tests` is
    not a list, or a test lacks a string `name`/`status` or has a non-string `message`.
    """
    data = load_json(text)
    if not is_object(data):
        raise ReportParseError(f"top level is a JSON {json_kind(data)}, expected an object")
    results = data.get("results")
    if not is_object(results):
        raise ReportParseError("missing object 'results'")
    tests = results.get("tests")
    if not is_array(tests):
        raise ReportParseError("missing list 'results.tests'")
    return AssertionReport(
        format="ctrf",
        assertions=tuple(_assertion(i, test) for i, test in enumerate(tests)),
        binary=False,
        source=source,
    )


def _assertion(index: int, test: object) -> Assertion:
    where = f"results.tests[{index}]"
    if not is_object(test):
        raise ReportParseError(f"{where} is a JSON {json_kind(test)}, expected an object")
    name = test.get("name")
    if not isinstance(name, str):
        raise ReportParseError(f"{where}.name is missing or not a string")
    status = test.get("status")
    if not isinstance(status, str):
        raise ReportParseError(f"{where}.status is missing or not a string")
    message = test.get("message")
    if message is None:
        message = ""
    elif not isinstance(message, str):
        raise ReportParseError(f"{where}.message is not a string")
    return Assertion(name=name, status=_STATUS_MAP.get(status, "failed"), message=message)
