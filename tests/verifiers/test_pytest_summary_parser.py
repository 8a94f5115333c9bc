"""Parsing the pytest -rA short test summary from verifier output."""

import pytest

from termgym.verifiers import parse_pytest_summary

# A Terminal-Bench style run: `pytest -rA /tests/test_outputs.py`, pytest 8.3, preceded by an
# earlier pytest run (a setup check) whose summary must be ignored, followed by shell output.
PYTEST_RA_OUTPUT = """\
+ pytest -rA /tests/setup_check.py
============================= test session starts ==============================
collected 1 item

../tests/setup_check.py F                                                [100%]
=========================== short test summary info ============================
FAILED ../tests/setup_check.py::test_stale - AssertionError: stale summary
============================== 1 failed in 0.01s ===============================
+ pytest -rA /tests/test_outputs.py
============================= test session starts ==============================
platform linux -- Python 3.12.7, pytest-8.3.4, pluggy-1.5.0
rootdir: /tests
plugins: json-ctrf-0.3.5
collected 9 items

../tests/test_outputs.py ..F.EsxXF                                       [100%]

==================================== ERRORS ====================================
______________________ ERROR at setup of test_db_migrated ______________________

    @pytest.fixture
    def db():
>       return sqlite3.connect("/app/data/app.db")
E       sqlite3.OperationalError: unable to open database file

/tests/test_outputs.py:9: OperationalError
=================================== FAILURES ===================================
_____________________________ test_report_content ______________________________

    def test_report_content():
        text = Path("/app/report.txt").read_text()
>       assert text.strip() == "42"
E       AssertionError: assert '41' == '42'
E         
E         - 42
E         + 41

/tests/test_outputs.py:21: AssertionError
==================================== PASSES ====================================
___________________________ test_report_exists ___________________________
----------------------------- Captured stdout call -----------------------------
checking /app/report.txt
=========================== short test summary info ============================
PASSED ../tests/test_outputs.py::test_report_exists
PASSED ../tests/test_outputs.py::test_lines[3-expected0]
PASSED ../tests/test_outputs.py::test_greeting[hello world]
SKIPPED [1] ../tests/test_outputs.py:30: needs network access
XFAIL ../tests/test_outputs.py::test_known_bug - reason: upstream issue #12
XPASS ../tests/test_outputs.py::test_flaky_timing - timing is unreliable
ERROR ../tests/test_outputs.py::test_db_migrated - sqlite3.OperationalError: unable to open database file
FAILED ../tests/test_outputs.py::test_report_content - AssertionError: assert '41' == '42'
FAILED ../tests/test_outputs.py::TestApi::test_status[GET /health] - assert 500 == 200
=== 2 failed, 3 passed, 1 skipped, 1 xfailed, 1 xpassed, 1 error in 0.12s ===
+ echo "FAILED this line is shell output, not pytest"
FAILED this line is shell output, not pytest
"""

EXPECTED = [
    ("../tests/test_outputs.py::test_report_exists", "passed", ""),
    ("../tests/test_outputs.py::test_lines[3-expected0]", "passed", ""),
    ("../tests/test_outputs.py::test_greeting[hello world]", "passed", ""),
    ("../tests/test_outputs.py:30", "skipped", "needs network access"),
    ("../tests/test_outputs.py::test_known_bug", "passed", "reason: upstream issue #12"),
    ("../tests/test_outputs.py::test_flaky_timing", "failed", "timing is unreliable"),
    ("../tests/test_outputs.py::test_db_migrated", "failed", "sqlite3.OperationalError: unable to open database file"),
    ("../tests/test_outputs.py::test_report_content", "failed", "AssertionError: assert '41' == '42'"),
    ("../tests/test_outputs.py::TestApi::test_status[GET /health]", "failed", "assert 500 == 200"),
]


def test_real_pytest_ra_output():
    report = parse_pytest_summary(PYTEST_RA_OUTPUT)
    assert report is not None
    assert report.format == "pytest" and report.binary is False and report.source == "verifier output"
    assert [(a.name, a.status, a.message) for a in report.assertions] == EXPECTED
    assert (report.passed, report.failed, report.skipped) == (4, 4, 1)


def test_minimal_summary_with_closing_line():
    text = (
        "=========================== short test summary info ============================\n"
        "PASSED tests/test_outputs.py::test_a\n"
        "PASSED tests/test_outputs.py::test_b\n"
        "PASSED tests/test_outputs.py::test_c\n"
        "FAILED tests/test_outputs.py::test_d - assert False\n"
        "FAILED tests/test_outputs.py::test_e - KeyError: 'x'\n"
        "=== 2 failed, 3 passed in 0.12s ===\n"
        "PASSED tests/after_the_closing_line.py::test_z\n"
    )
    report = parse_pytest_summary(text)
    assert report is not None
    assert [a.name[-6:] for a in report.assertions] == ["test_a", "test_b", "test_c", "test_d", "test_e"]
    assert (report.passed, report.failed) == (3, 2)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "collected 0 items\n\n============================ no tests ran in 0.01s =============================\n",
        "PASSED tests/test_x.py::test_a\n",  # result lines without the banner are not a summary
        "short test summary info\nPASSED tests/test_x.py::test_a\n",  # banner needs the = rules
    ],
)
def test_no_banner_returns_none(text):
    assert parse_pytest_summary(text) is None


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("PASSED tests/t.py::test_a", ("tests/t.py::test_a", "passed", "")),
        ("FAILED tests/t.py::test_a - assert 1 == 2", ("tests/t.py::test_a", "failed", "assert 1 == 2")),
        ("FAILED tests/t.py::test_a[x - y] - ValueError", ("tests/t.py::test_a[x - y]", "failed", "ValueError")),
        (
            "ERROR tests/t.py - ModuleNotFoundError: No module named 'requests'",
            ("tests/t.py", "failed", "ModuleNotFoundError: No module named 'requests'"),
        ),
        ("SKIPPED [2] tests/t.py:7: unconditional skip", ("tests/t.py:7", "skipped", "unconditional skip")),
        ("SKIPPED [1] tests/t.py: module skipped", ("tests/t.py", "skipped", "module skipped")),
        ("XFAIL tests/t.py::test_a", ("tests/t.py::test_a", "passed", "")),
        ("XPASS tests/t.py::test_a", ("tests/t.py::test_a", "failed", "")),
        ("XPASS tests/t.py::test_a flaky on CI", ("tests/t.py::test_a", "failed", "flaky on CI")),  # pytest 7 form
    ],
)
def test_line_forms(line, expected):
    text = f"==== short test summary info ====\n{line}\n==== 1 passed in 0.01s ====\n"
    report = parse_pytest_summary(text)
    assert report is not None
    (assertion,) = report.assertions
    assert (assertion.name, assertion.status, assertion.message) == expected


def test_ansi_colours_are_removed():
    text = (
        "\x1b[36m\x1b[1m=========================== short test summary info ============================\x1b[0m\n"
        "\x1b[32mPASSED\x1b[0m tests/t.py::\x1b[1mtest_a\x1b[0m\n"
        "\x1b[31mFAILED\x1b[0m tests/t.py::\x1b[1mtest_b\x1b[0m - assert 0\n"
        "\x1b[31m========================= \x1b[31m\x1b[1m1 failed\x1b[0m, \x1b[32m1 passed\x1b[0m\x1b[31m in 0.02s\x1b[0m\x1b[31m =========================\x1b[0m\n"
    )
    report = parse_pytest_summary(text)
    assert report is not None
    assert [(a.name, a.status) for a in report.assertions] == [
        ("tests/t.py::test_a", "passed"),
        ("tests/t.py::test_b", "failed"),
    ]


def test_multiline_failure_message_is_joined():
    text = (
        "=== short test summary info ===\n"
        "FAILED tests/t.py::test_a - AssertionError: first line\n"
        "  second line\n"
        "PASSED tests/t.py::test_b\n"
        "=== 1 failed, 1 passed in 0.01s ===\n"
    )
    report = parse_pytest_summary(text)
    assert report is not None
    assert report.assertions[0].message == "AssertionError: first line\nsecond line"
    assert report.assertions[1].message == ""


def test_banner_without_results_is_an_empty_report():
    report = parse_pytest_summary("=== short test summary info ===\n=== 1 warning in 0.01s ===\n")
    assert report is not None and report.assertions == () and not report.resolved
