"""CTRF JSON parsing."""

import json

import pytest

from termgym.verifiers import ReportParseError, parse_ctrf

# As written by pytest-json-ctrf (pytest --ctrf /logs/verifier/ctrf.json).
PYTEST_JSON_CTRF = """{
  "results": {
    "tool": {"name": "pytest"},
    "summary": {"tests": 6, "passed": 2, "failed": 1, "skipped": 1, "pending": 1, "other": 1,
                "start": 1718012345678, "stop": 1718012346012},
    "tests": [
      {"name": "test_outputs.py::test_hello_file_exists", "status": "passed", "duration": 0.0009,
       "start": 1718012345700, "stop": 1718012345701, "rawStatus": "passed", "tags": [],
       "type": "unit", "filepath": "/tests/test_outputs.py", "retries": 0, "flaky": false},
      {"name": "test_outputs.py::test_hello_file_content", "status": "failed", "duration": 0.0021,
       "message": "AssertionError: Expected 'Hello, world!' but got 'Hello world'\\nassert 'Hello world' == 'Hello, world!'",
       "trace": "/tests/test_outputs.py:14: in test_hello_file_content\\n    assert content == expected",
       "rawStatus": "failed", "filepath": "/tests/test_outputs.py"},
      {"name": "test_outputs.py::test_permissions[0o644]", "status": "passed", "duration": 0.0004},
      {"name": "test_outputs.py::test_network", "status": "skipped", "duration": 0,
       "message": "Skipped: no network in sandbox"},
      {"name": "test_outputs.py::test_later", "status": "pending", "duration": 0},
      {"name": "test_outputs.py::test_odd", "status": "other", "duration": 0, "message": null}
    ],
    "environment": {"appName": "hello-world"}
  }
}"""


def test_pytest_json_ctrf_output():
    report = parse_ctrf(PYTEST_JSON_CTRF)
    assert report.format == "ctrf" and report.binary is False and report.source == "ctrf.json"
    assert [(a.name, a.status) for a in report.assertions] == [
        ("test_outputs.py::test_hello_file_exists", "passed"),
        ("test_outputs.py::test_hello_file_content", "failed"),
        ("test_outputs.py::test_permissions[0o644]", "passed"),
        ("test_outputs.py::test_network", "skipped"),
        ("test_outputs.py::test_later", "skipped"),
        ("test_outputs.py::test_odd", "failed"),
    ]
    assert report.assertions[1].message.startswith("AssertionError: Expected 'Hello, world!'")
    assert report.assertions[0].message == "" and report.assertions[5].message == ""
    assert (report.passed, report.failed, report.skipped, report.total) == (2, 2, 2, 4)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ("passed", "passed"),
        ("failed", "failed"),
        ("skipped", "skipped"),
        ("pending", "skipped"),
        ("other", "failed"),
        ("PASSED", "failed"),
        ("", "failed"),
    ],
)
def test_status_mapping(status, expected):
    text = json.dumps({"results": {"tests": [{"name": "t", "status": status}]}})
    assert parse_ctrf(text).assertions[0].status == expected


def test_empty_test_list_is_valid():
    report = parse_ctrf('{"results": {"tests": []}}')
    assert report.assertions == () and report.error is None


def test_long_message_truncated():
    text = json.dumps({"results": {"tests": [{"name": "t", "status": "failed", "message": "m" * 3000}]}})
    assert len(parse_ctrf(text).assertions[0].message) == 1000


@pytest.mark.parametrize(
    "text",
    [
        '{"results": {"tests": [{"name": "t", "status": "passed"}',  # truncated
        '[{"name": "t", "status": "passed"}]',  # list instead of object
        "",
        "null",
        '"results"',
        "{}",
        '{"results": []}',
        '{"results": {}}',
        '{"results": {"tests": {"name": "t"}}}',
        '{"results": {"tests": ["t"]}}',
        '{"results": {"tests": [{"status": "passed"}]}}',
        '{"results": {"tests": [{"name": 7, "status": "passed"}]}}',
        '{"results": {"tests": [{"name": "t"}]}}',
        '{"results": {"tests": [{"name": "t", "status": true}]}}',
        '{"results": {"tests": [{"name": "t", "status": "failed", "message": {"a": 1}}]}}',
        '{"results": {"tests": [{"name": "t", "status": "passed", "duration": NaN}]}}',
        '{"results": {"tests": [], "n": ' + "9" * 5000 + "}}",  # integer too long to convert
        "[" * 100_000 + "]" * 100_000,  # nesting deeper than the recursion limit
    ],
)
def test_garbage_raises_report_parse_error(text):
    with pytest.raises(ReportParseError):
        parse_ctrf(text)


# As written by verifiers/kit/assert.sh (tg_check failing, tg_check_sh passing, tg_skip).
KIT_CTRF = """{"results":{"tool":{"name":"termgym-assert"},"summary":{"tests":3,"passed":1,"failed":1,"skipped":1,\
"pending":0,"other":0,"start":1795960440642,"stop":1795960440692},"tests":[{"name":"report exists","status":"failed",\
"duration":0,"message":"exit 1: "},
{"name":"says \\"hi\\"","status":"passed","duration":0,"message":""},
{"name":"optional part","status":"skipped","duration":0,"message":"not graded yet"}
]}}
"""


def test_assertion_kit_output():
    report = parse_ctrf(KIT_CTRF)
    assert [(a.name, a.status, a.message) for a in report.assertions] == [
        ("report exists", "failed", "exit 1: "),
        ('says "hi"', "passed", ""),
        ("optional part", "skipped", "not graded yet"),
    ]
