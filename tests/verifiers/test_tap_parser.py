"""TAP 12/13/14 parsing."""

import pytest

from termgym.verifiers import ReportParseError, parse_tap

# TAP 13 with the plan at the end, a YAML diagnostic block, TODO and SKIP directives.
TAP13_PLAN_AT_END = """TAP version 13
ok 1 - input file opened
not ok 2 - first line of the input valid
  ---
  message: 'First line invalid'
  severity: fail
  data:
    got: 'Flirble'
    expect: 'Fnible'
  ...
ok 3 - read the rest of the file
not ok 4 - summarized correctly # TODO Not written yet
ok 5 - network fetch # SKIP no network in sandbox
# 3 of 5 tests ran
1..5
"""

# TAP 14 with indented subtests (node-tap style), which are summarised by their parent line.
TAP14_SUBTESTS = """TAP version 14
# Subtest: parser
    ok 1 - handles empty input
    not ok 2 - handles unicode
    1..2
not ok 1 - parser
# Subtest: writer
    ok 1 - writes file
    1..1
ok 2 - writer
1..2
"""

BAIL_OUT = """1..5
ok 1 - server started
ok 2 - port open
Bail out! database unavailable
ok 3 - never parsed
"""


def _rows(report):
    return [(a.name, a.status) for a in report.assertions]


def test_plan_at_end_with_yaml_todo_and_skip():
    report = parse_tap(TAP13_PLAN_AT_END)
    assert report.format == "tap" and report.binary is False
    assert _rows(report) == [
        ("input file opened", "passed"),
        ("first line of the input valid", "failed"),
        ("read the rest of the file", "passed"),
        ("summarized correctly", "skipped"),  # TODO counts neither way even though "not ok"
        ("network fetch", "skipped"),
    ]
    assert report.assertions[3].message == "TODO: Not written yet"
    assert report.assertions[4].message == "SKIP: no network in sandbox"
    assert (report.passed, report.failed, report.total) == (2, 1, 3)


def test_subtests_are_ignored():
    assert _rows(parse_tap(TAP14_SUBTESTS)) == [("parser", "failed"), ("writer", "passed")]


def test_bail_out_fails_remaining_planned_tests():
    report = parse_tap(BAIL_OUT)
    assert _rows(report) == [
        ("server started", "passed"),
        ("port open", "passed"),
        ("missing test 3", "failed"),
        ("missing test 4", "failed"),
        ("missing test 5", "failed"),
    ]
    assert "database unavailable" in report.assertions[2].message
    assert not report.resolved


def test_bail_out_without_plan_fails_the_run():
    report = parse_tap("ok 1 - a\nBail out!\n")
    assert _rows(report) == [("a", "passed"), ("bail out", "failed")]


@pytest.mark.parametrize(
    ("text", "rows"),
    [
        # numbers are optional and auto-increment; missing planned tests fail
        (
            "1..4\nok\nok - second\nnot ok\n",
            [("test 1", "passed"), ("second", "passed"), ("test 3", "failed"), ("missing test 4", "failed")],
        ),
        # auto-increment continues from an explicit number
        ("ok 2 - b\nok - c\n1..3\n", [("b", "passed"), ("c", "passed"), ("missing test 1", "failed")]),
        # no plan: just the test points
        ("ok 1 - a\nnot ok 2 - b\n", [("a", "passed"), ("b", "failed")]),
        # more tests than planned is a plan failure
        ("1..1\nok 1 - a\nok 2 - b\n", [("a", "passed"), ("b", "passed"), ("plan", "failed")]),
        # duplicated numbers leave a planned number unreported
        ("1..2\nok 1 - a\nok 1 - a again\n", [("a", "passed"), ("a again", "passed"), ("missing test 2", "failed")]),
        # skip-all plan: valid, nothing counted
        ("1..0 # Skipped: no display available\n", []),
        # lowercase and variant directives; a skip with no description is named by number
        (
            "ok 1 # skip\nok 2 - x # Skipped: later\nnot ok 3 - y # todo\n",
            [("test 1", "skipped"), ("x", "skipped"), ("y", "skipped")],
        ),
        # an escaped hash is not a directive; a plain hash is part of the description
        (
            "ok 1 - handles \\# SKIP literally\nok 2 - issue #42 fixed\n",
            [("handles # SKIP literally", "passed"), ("issue #42 fixed", "passed")],
        ),
        # Windows line endings, pragmas and comments
        ("TAP version 14\r\npragma +strict\r\n1..1\r\n# hello\r\nok 1 - crlf\r\n", [("crlf", "passed")]),
        # "okay" and "not okay" are not test points
        ("okay then\nnot okay\nok 1 - real\n", [("real", "passed")]),
    ],
    ids=[
        "auto-increment",
        "continue-numbering",
        "no-plan",
        "over-plan",
        "duplicate-number",
        "skip-all",
        "directive-variants",
        "escaped-hash",
        "crlf-pragma",
        "okay-is-not-ok",
    ],
)
def test_tap_cases(text, rows):
    assert _rows(parse_tap(text)) == rows


def test_failed_test_message_names_the_number():
    assert parse_tap("not ok 7 - broken\n").assertions[0].message == "not ok 7"


@pytest.mark.parametrize(
    "text",
    [
        "",
        "hello world\nthis is not TAP\n",
        "    ok 1 - only indented\n    1..1\n",  # subtest lines alone are not a report
        "1..2\nok 1\nok 2\n1..2\n",  # two plans
        "1..999999999\n",  # absurd plan
        "ok 12345678901234567890 - absurd number\n",
    ],
)
def test_garbage_raises_report_parse_error(text):
    with pytest.raises(ReportParseError):
        parse_tap(text)
