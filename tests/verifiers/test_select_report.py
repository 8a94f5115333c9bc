"""Choosing the report to grade: priority order, aggregation, and no exception for any input."""

import json
import random
import re

import pytest

from termgym.verifiers import (
    MAX_REPORT_BYTES,
    check_assertion_count,
    compute_reward,
    report_format_of,
    select_report,
    too_many_files_report,
)

CTRF = json.dumps(
    {
        "results": {
            "tool": {"name": "pytest"},
            "tests": [
                {"name": "ctrf::a", "status": "passed", "duration": 0.1},
                {"name": "ctrf::b", "status": "passed", "duration": 0.1},
            ],
        }
    }
).encode()
JUNIT_A = b'<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest"><testcase classname="a" name="one"/></testsuite></testsuites>'
JUNIT_B = b'<testsuite name="b"><testcase classname="b" name="two"><failure message="nope"/></testcase></testsuite>'
TAP_A = b"TAP version 13\n1..1\nok 1 - tap a\n"
TAP_B = b"ok 1 - tap b\nnot ok 2 - tap b2\n1..2\n"
PYTEST_OUTPUT = (
    "collected 2 items\n\n"
    "=========================== short test summary info ============================\n"
    "PASSED tests/test_outputs.py::test_one\n"
    "FAILED tests/test_outputs.py::test_two - assert 1 == 2\n"
    "========================= 1 failed, 1 passed in 0.05s ==========================\n"
)
REWARD_JSON = b'{"reward": 1.0}'
REWARD_TXT = b"1\n"

ALL_FILES = {
    "ctrf.json": CTRF,
    "results.xml": JUNIT_A,
    "results.tap": TAP_A,
    "reward.json": REWARD_JSON,
    "reward.txt": REWARD_TXT,
}


def _without(*names):
    return {k: v for k, v in ALL_FILES.items() if k not in names}


@pytest.mark.parametrize(
    ("files", "output", "exit_code", "format", "source", "names"),
    [
        (ALL_FILES, PYTEST_OUTPUT, 1, "ctrf", "ctrf.json", ["ctrf::a", "ctrf::b"]),
        (_without("ctrf.json"), PYTEST_OUTPUT, 1, "junit", "results.xml", ["a::one"]),
        (_without("ctrf.json", "results.xml"), PYTEST_OUTPUT, 1, "tap", "results.tap", ["tap a"]),
        (
            _without("ctrf.json", "results.xml", "results.tap"),
            PYTEST_OUTPUT,
            1,
            "reward-file",
            "reward.json",
            ["reward"],
        ),  # a report file outranks a summary in the output, which an agent's program can print
        ({"reward.txt": b"0"}, PYTEST_OUTPUT, 0, "reward-file", "reward.txt", ["reward"]),
        (
            {},
            PYTEST_OUTPUT,
            1,
            "pytest",
            "verifier output",
            ["tests/test_outputs.py::test_one", "tests/test_outputs.py::test_two"],
        ),
        ({}, "", 3, "exit-code", "exit code", ["exit code"]),
        (
            {"notes.log": b"ok 1\n", "ctrf.json.bak": CTRF, "reward.json~": REWARD_JSON},
            "",
            0,
            "exit-code",
            "exit code",
            ["exit code"],
        ),  # near-miss names are not reports
        (
            {"sub/ctrf.json": CTRF, "sub/r.xml": JUNIT_A},
            "",
            0,
            "exit-code",
            "exit code",
            ["exit code"],
        ),  # not top level
    ],
    ids=[
        "ctrf-first",
        "junit-second",
        "tap-third",
        "reward-json-fourth",
        "reward-txt-fifth",
        "pytest-sixth",
        "exit-code-last",
        "near-miss-names",
        "nested-paths",
    ],
)
def test_priority_order(files, output, exit_code, format, source, names):
    report = select_report(files, output, exit_code)
    assert report.error is None
    assert (report.format, report.source) == (format, source)
    assert [a.name for a in report.assertions] == names


def test_reward_json_beats_a_failing_exit_code_and_reward_txt():
    report = select_report({"reward.json": b'{"reward": 1}', "reward.txt": b"0"}, "", 1)
    assert report.source == "reward.json" and report.resolved


@pytest.mark.parametrize(
    ("extension", "first", "second", "names"),
    [("xml", JUNIT_A, JUNIT_B, ["a::one", "b::two"]), ("tap", TAP_A, TAP_B, ["tap a", "tap b", "tap b2"])],
)
def test_multiple_files_are_sorted_by_name_and_aggregated(extension, first, second, names):
    files = {f"z-second.{extension}": second, f"a-first.{extension}": first}
    report = select_report(files, "", 0)
    assert [a.name for a in report.assertions] == names
    assert report.source == f"a-first.{extension}, z-second.{extension}"


def test_one_bad_junit_file_spoils_the_aggregate_and_is_named():
    report = select_report({"a.xml": JUNIT_A, "b.xml": b"<testsuites><oops"}, "", 0)
    assert report.format == "junit" and report.assertions == ()
    assert report.error is not None
    assert report.error.startswith("unparseable report b.xml: ")


GARBAGE = {
    "ctrf.json": b'{"results": {"tests": [',
    "results.xml": b"<testsuites><testcase name='a'>",
    "results.tap": b"this is not TAP\n",
    "reward.json": b'{"reward": "yes"}',
    "reward.txt": b"passed\n",
}
FORMATS = {
    "ctrf.json": "ctrf",
    "results.xml": "junit",
    "results.tap": "tap",
    "reward.json": "reward-file",
    "reward.txt": "reward-file",
}
ORDER = ["ctrf.json", "results.xml", "results.tap", "reward.json", "reward.txt"]


@pytest.mark.parametrize("name", ORDER)
def test_garbage_first_source_does_not_fall_through(name):
    files = {later: ALL_FILES[later] for later in ORDER[ORDER.index(name) + 1 :]}
    files[name] = GARBAGE[name]
    # the pytest summary ranks below every report file, so it must not be fallen through to
    report = select_report(files, PYTEST_OUTPUT, 0)
    assert report.format == FORMATS[name] and report.source == name
    assert report.assertions == ()
    assert report.error is not None
    assert report.error.startswith(f"unparseable report {name}: ")
    assert not report.resolved and compute_reward(report) == 0.0


def _padded(content: bytes, size: int) -> bytes:
    """Valid content padded with trailing whitespace to exactly `size` bytes."""
    return content + b" " * (size - len(content))


@pytest.mark.parametrize("name", ORDER)
def test_oversized_file_is_unparseable(name):
    report = select_report({name: _padded(ALL_FILES[name], 5 * 1024 * 1024)}, "", 0)
    assert report.format == FORMATS[name] and report.assertions == ()
    assert report.error == f"unparseable report {name}: 5242880 bytes is over the 4194304-byte limit"


def test_file_of_exactly_the_limit_is_parsed():
    report = select_report({"ctrf.json": _padded(CTRF, MAX_REPORT_BYTES)}, "", 1)
    assert report.error is None and report.passed == 2


BILLION_LAUGHS = b"""<?xml version="1.0"?>
<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
<!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
<!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">]>
<testsuites><testcase name="&lol3;"/></testsuites>"""
XXE = b"""<?xml version="1.0"?><!DOCTYPE t [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<testsuites><testcase name="&x;"/></testsuites>"""


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("junit.xml", BILLION_LAUGHS, "unsafe XML"),
        ("junit.xml", XXE, "unsafe XML"),
        ("junit.xml", b"\xff\xfe<testsuites/>", "invalid XML"),
        ("ctrf.json", b'{"results": {"tests": [{"name": "a", "status": "pas', "invalid JSON"),
        ("ctrf.json", b'[{"name": "a", "status": "passed"}]', "expected an object"),
        ("ctrf.json", b'{"results": {"tests": [{"name": "caf\xe9", "status": "passed"}]}}', "not valid UTF-8"),
        ("ctrf.json", b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
        ("ctrf.json", b'{"results": {"tests": [{"name": ["x"], "status": "passed"}]}}', "name"),
        ("ctrf.json", None, "not bytes"),
        ("ctrf.json", 12, "not bytes"),
        ("reward.json", b'{"reward": NaN}', "NaN"),
        ("reward.json", b'{"reward": "1.0"}', "expected a number"),
        ("reward.json", b'{"reward": ' + b"1" * 5000 + b"}", "invalid JSON"),
        ("reward.json", b"[1.0]", "expected an object"),
        ("reward.txt", b"nan\n", "not a single number"),
        ("results.tap", b"\x00\x01\x02", "no TAP"),
    ],
)
def test_fault_cases_become_error_reports(name, content, reason):
    output = "" if name.startswith("reward") else PYTEST_OUTPUT  # a later source that must be ignored
    report = select_report({name: content}, output, 0)
    assert report.assertions == ()
    assert report.error is not None
    assert report.error.startswith(f"unparseable report {name}: ") and reason in report.error
    assert compute_reward(report) == 0.0


@pytest.mark.parametrize("name", ORDER)
def test_random_bytes_never_raise(name):
    rng = random.Random(20240610)
    for _ in range(25):
        content = rng.randbytes(rng.randrange(1, 4096))
        report = select_report({name: content}, "", 0)
        assert report.format == FORMATS[name]
        assert report.error is not None and report.assertions == ()


def test_str_and_bytearray_content_are_accepted():
    assert select_report({"ctrf.json": CTRF.decode()}, "", 1).passed == 2  # pyright: ignore[reportArgumentType]  # deliberately str, not bytes: that it is accepted is under test
    assert select_report({"reward.txt": bytearray(b"1")}, "", 1).resolved  # pyright: ignore[reportArgumentType]  # deliberately a bytearray: that it is accepted is under test


def test_bom_prefixed_json_is_accepted():
    assert select_report({"ctrf.json": b"\xef\xbb\xbf" + CTRF}, "", 1).passed == 2


def test_no_source_at_all_is_an_error():
    report = select_report({}, "", None)
    assert report.format == "exit-code" and report.binary is True
    assert report.error == "verifier produced no result"
    assert [(a.name, a.status) for a in report.assertions] == [("exit code", "failed")]
    assert compute_reward(report) == 0.0


def test_pytest_summary_beats_exit_code_zero():
    report = select_report({}, PYTEST_OUTPUT, 0)
    assert report.format == "pytest" and (report.passed, report.failed) == (1, 1)


@pytest.mark.parametrize(
    ("files", "output", "exit_code", "message"),
    [
        ([("ctrf.json", CTRF)], "", 0, "files must be a Mapping, not list"),
        ({}, None, 0, "verifier_output must be a str, not NoneType"),
        ({}, b"output", 0, "verifier_output must be a str, not bytes"),
        ({}, "", "0", "exit_code must be an int or None, not str"),
        ({}, "", 1.0, "exit_code must be an int or None, not float"),
        ({}, "", True, "exit_code must be an int or None, not bool"),
    ],
)
def test_wrong_argument_types_raise_value_error(files, output, exit_code, message):
    with pytest.raises(ValueError, match=message):
        select_report(files, output, exit_code)


@pytest.mark.parametrize(
    ("declared", "files", "output", "exit_code", "format", "source", "error"),
    [
        ("ctrf", ALL_FILES, PYTEST_OUTPUT, 0, "ctrf", "ctrf.json", None),
        ("junit", ALL_FILES, PYTEST_OUTPUT, 0, "junit", "results.xml", None),  # ctrf.json present, not read
        ("reward-file", ALL_FILES, PYTEST_OUTPUT, 0, "reward-file", "reward.json", None),
        ("pytest", ALL_FILES, PYTEST_OUTPUT, 0, "pytest", "verifier output", None),
        ("exit-code", ALL_FILES, PYTEST_OUTPUT, 0, "exit-code", "exit code", None),
        # the declared source is missing: an error, whatever else the verifier left
        (
            "ctrf",
            _without("ctrf.json"),
            PYTEST_OUTPUT,
            0,
            "ctrf",
            "ctrf.json",
            "the task declares its report as ctrf, but the verifier produced no ctrf.json",
        ),
        (
            "tap",
            {"ctrf.json": CTRF},
            "",
            0,
            "tap",
            "TAP *.tap file",
            "the task declares its report as tap, but the verifier produced no TAP *.tap file",
        ),
        (
            "pytest",
            ALL_FILES,
            "no summary",
            0,
            "pytest",
            "pytest summary in its output",
            "the task declares its report as pytest, but the verifier produced no pytest summary in its output",
        ),
        (
            "exit-code",
            {},
            "",
            None,
            "exit-code",
            "exit code",
            "the task declares its report as exit-code, but the verifier produced no exit code",
        ),
    ],
)
def test_a_declared_format_is_the_only_source_read(declared, files, output, exit_code, format, source, error):
    report = select_report(files, output, exit_code, declared=declared)
    assert (report.format, report.source, report.error) == (format, source, error)
    if error:
        assert report.assertions == () and not report.resolved and compute_reward(report) == 0.0


def test_a_declared_ctrf_task_ignores_a_forged_summary_in_its_output():
    forged = "=== short test summary info ===\n" + "".join(f"PASSED t.py::test_{i}\n" for i in range(50000))
    report = select_report({}, forged, 0, declared="ctrf")
    assert report.error is not None and report.passed == 0 and compute_reward(report) == 0.0


def test_an_unknown_declared_format_is_a_value_error():
    message = "declared must be one of ['ctrf', 'exit-code', 'junit', 'pytest', 'reward-file', 'tap'], not 'xml'"
    with pytest.raises(ValueError, match=re.escape(message)):
        select_report({}, "", 0, declared="xml")  # pyright: ignore[reportArgumentType]  # deliberately the wrong type: the validation is under test


def _ctrf_report(passed: int, failed: int = 0, skipped: int = 0):
    tests = [{"name": f"p{i}", "status": "passed"} for i in range(passed)]
    tests += [{"name": f"f{i}", "status": "failed"} for i in range(failed)]
    tests += [{"name": f"s{i}", "status": "skipped"} for i in range(skipped)]
    return select_report({"ctrf.json": json.dumps({"results": {"tests": tests}}).encode()}, "", 0)


@pytest.mark.parametrize(
    ("passed", "failed", "skipped", "expected", "total", "resolved", "reward", "error"),
    [
        (5, 0, 0, 5, 5, True, 0.25, None),  # exactly what the verifier defines
        (4, 1, 2, 5, 5, False, 0.20, None),  # skipped ones count neither way, nor against the count
        (5, 0, 0, None, 5, True, 0.25, None),  # nothing declared: unchecked
        (3, 0, 0, 5, 5, False, 0.15, None),  # a verifier stopped half-way: the rest count as failed
        (6, 0, 0, 5, 0, False, 0.0, "the report counts 6 assertions; the task's verifier defines 5"),
        (60000, 0, 0, 5, 0, False, 0.0, "the report counts 60000 assertions; the task's verifier defines 5"),
    ],
)
def test_assertion_count_is_held_to_the_tasks(passed, failed, skipped, expected, total, resolved, reward, error):
    report = check_assertion_count(_ctrf_report(passed, failed, skipped), expected)
    assert (report.total, report.resolved, report.error) == (total, resolved, error)
    assert compute_reward(report) == pytest.approx(reward)


def test_missing_assertions_are_named_as_not_reported():
    report = check_assertion_count(_ctrf_report(1), 3)
    assert [a.name for a in report.assertions if a.status == "failed"] == [
        "(assertion 2 of 3 not reported)",
        "(assertion 3 of 3 not reported)",
    ]


@pytest.mark.parametrize(
    "report", [select_report({"reward.txt": b"1"}, "", 0), select_report({"ctrf.json": b"{"}, "", 0)]
)
def test_binary_and_error_reports_are_not_count_checked(report):
    assert check_assertion_count(report, 7) is report


@pytest.mark.parametrize("expected", [0, -1, True, 2.0])
def test_a_bad_expected_count_is_a_value_error(expected):
    with pytest.raises(ValueError, match=re.escape(f"expected must be a positive int or None, not {expected!r}")):
        check_assertion_count(_ctrf_report(1), expected)


@pytest.mark.parametrize(
    ("counts", "declared", "format"),
    [
        ({"junit": 40}, None, "junit"),
        ({"tap": 30, "ctrf": 1, "reward-file": 2}, None, "ctrf"),
        ({"junit": 40}, "ctrf", "ctrf"),
        ({}, None, "exit-code"),
    ],
)
def test_too_many_report_files_is_an_error_never_a_truncation(counts, declared, format):
    report = too_many_files_report(counts, 32, declared)
    assert report.format == format and report.assertions == () and compute_reward(report) == 0.0
    assert (
        report.error
        == f"the verifier wrote {sum(counts.values())} report files to its log directory, more than the 32 termgym reads"
    )


@pytest.mark.parametrize(
    ("name", "format"),
    [
        ("ctrf.json", "ctrf"),
        ("a.xml", "junit"),
        (".hidden.tap", "tap"),
        ("reward.json", "reward-file"),
        ("reward.txt", "reward-file"),
        ("ctrf.json.tmp", None),
        ("test-stdout.txt", None),
        ("notes.log", None),
    ],
)
def test_report_format_of_a_file_name(name, format):
    assert report_format_of(name) == format
