"""The report data model: validation, counting, resolution, message truncation."""

import dataclasses
import re

import pytest

import termgym.verifiers as verifiers
from termgym.verifiers.report import MAX_MESSAGE_CHARS, Assertion, AssertionReport, Status


def _report(*statuses: Status, error: str | None = None, binary: bool = False) -> AssertionReport:
    assertions = tuple(Assertion(name=f"t{i}", status=s) for i, s in enumerate(statuses))
    return AssertionReport(format="ctrf", assertions=assertions, binary=binary, error=error)


@pytest.mark.parametrize(
    ("statuses", "error", "counts", "resolved"),
    [
        ((), None, (0, 0, 0, 0), False),  # nothing counted is never resolved
        (("passed",), None, (1, 0, 0, 1), True),
        (("passed", "passed", "skipped"), None, (2, 0, 1, 2), True),
        (("skipped", "skipped"), None, (0, 0, 2, 0), False),  # only skips: nothing counted
        (("passed", "failed"), None, (1, 1, 0, 2), False),
        (("failed",), None, (0, 1, 0, 1), False),
        (("passed",), "unparseable report x: y", (1, 0, 0, 1), False),  # error blocks resolution
    ],
)
def test_counts_and_resolution(statuses, error, counts, resolved):
    report = _report(*statuses, error=error)
    assert (report.passed, report.failed, report.skipped, report.total) == counts
    assert report.resolved is resolved


@pytest.mark.parametrize(("status", "passed"), [("passed", True), ("failed", False), ("skipped", False)])
def test_assertion_passed_property(status, passed):
    assert Assertion(name="a", status=status).passed is passed


def test_message_is_truncated_to_1000_chars():
    assertion = Assertion(name="a", status="failed", message="x" * 5000)
    assert MAX_MESSAGE_CHARS == 1000
    assert assertion.message == "x" * 1000


def test_short_message_is_kept():
    assert Assertion(name="a", status="failed", message="boom").message == "boom"


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: Assertion(name="a", status="ok"),  # pyright: ignore[reportArgumentType]  # deliberately the wrong type: the validation is under test
            "assertion status must be one of ['failed', 'passed', 'skipped'], not 'ok'",
        ),
        (
            lambda: Assertion(name=1, status="passed"),  # pyright: ignore[reportArgumentType]  # deliberately the wrong type: the validation is under test
            "assertion name must be a str, not int",
        ),
        (
            lambda: Assertion(name="a", status="failed", message=None),  # pyright: ignore[reportArgumentType]  # deliberately the wrong type: the validation is under test
            "assertion message must be a str, not NoneType",
        ),
        (
            lambda: AssertionReport(format="xunit", assertions=(), binary=False),  # pyright: ignore[reportArgumentType]  # deliberately the wrong type: the validation is under test
            "report format must be one of ['ctrf', 'exit-code', 'junit', 'pytest', 'reward-file', 'tap'], not 'xunit'",
        ),
        (
            lambda: AssertionReport(format="ctrf", assertions=("passed",), binary=False),  # pyright: ignore[reportArgumentType]  # deliberately the wrong type: the validation is under test
            "assertions must be Assertion objects, not str",
        ),
        (
            lambda: AssertionReport(format="ctrf", assertions=(), binary=1),  # pyright: ignore[reportArgumentType]  # deliberately the wrong type: the validation is under test
            "binary must be a bool",
        ),
        (
            lambda: AssertionReport(format="ctrf", assertions=(), binary=False, error=3),  # pyright: ignore[reportArgumentType]  # deliberately the wrong type: the validation is under test
            "error must be a str or None",
        ),
    ],
)
def test_invalid_construction_raises_value_error(build, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build()


def test_assertions_become_a_tuple_and_objects_are_frozen():
    report = AssertionReport(
        format="tap",
        assertions=[Assertion(name="a", status="passed")],  # pyright: ignore[reportArgumentType]  # deliberately a list: its conversion to a tuple is under test
        binary=False,
    )
    assert isinstance(report.assertions, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.error = "x"  # pyright: ignore[reportAttributeAccessIssue]  # deliberately writes a frozen field: the FrozenInstanceError is under test
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.assertions[0].status = "failed"  # pyright: ignore[reportAttributeAccessIssue]  # deliberately writes a frozen field: the FrozenInstanceError is under test


def test_report_parse_error_is_a_value_error():
    assert issubclass(verifiers.ReportParseError, ValueError)


@pytest.mark.parametrize(
    "name",
    [
        "Assertion",
        "AssertionReport",
        "ReportParseError",
        "select_report",
        "compute_reward",
        "DEFAULT_SCALE",
        "MAX_REPORT_BYTES",
        "parse_ctrf",
        "parse_junit",
        "parse_tap",
        "parse_pytest_summary",
        "parse_reward_json",
        "parse_reward_txt",
        "from_exit_code",
    ],
)
def test_package_exports(name):
    assert name in verifiers.__all__
    assert getattr(verifiers, name) is not None


def test_constants():
    assert verifiers.DEFAULT_SCALE == 20
    assert verifiers.MAX_REPORT_BYTES == 4 * 1024 * 1024
