"""Binary reports: reward.json, reward.txt and exit codes."""

import pytest

from termgym.verifiers import ReportParseError, from_exit_code, parse_reward_json, parse_reward_txt


def _outcome(report):
    (assertion,) = report.assertions
    assert assertion.name == "reward"
    assert report.format == "reward-file" and report.binary is True
    return assertion.status


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ('{"reward": 1.0}', "passed"),
        ('{"reward": 1}', "passed"),
        ('{"reward": 2.5}', "passed"),
        ('{"reward": 0.999}', "failed"),
        ('{"reward": 0}', "failed"),
        ('{"reward": -3}', "failed"),
        ('{"reward": 0.0, "accuracy": 1.0}', "failed"),  # "reward" wins over the mean
        ('{"accuracy": 1.0, "format": 1}', "passed"),  # mean 1.0
        ('{"accuracy": 1.0, "format": 0.5}', "failed"),  # mean 0.75
        ('{"a": 1e308, "b": 1e308}', "passed"),  # the mean does not overflow
        (' \n{"reward": 1.0}\n', "passed"),
    ],
)
def test_reward_json(text, status):
    assert _outcome(parse_reward_json(text)) == status


def test_reward_json_failed_message_shows_the_value():
    assert parse_reward_json('{"reward": 0.25}').assertions[0].message == "reward 0.25 < 1"


@pytest.mark.parametrize(
    "text",
    [
        '{"reward": NaN}',
        '{"reward": Infinity}',
        '{"reward": -Infinity}',
        '{"reward": 1e999}',  # overflows to infinity
        '{"reward": "1.0"}',  # a string is not a number
        '{"accuracy": 1.0, "note": "all good"}',  # every value must be a number
        '{"reward": true}',
        '{"reward": null}',
        '{"reward": [1]}',
        '{"reward": {"value": 1}}',
        "{}",
        "[1.0]",
        "1.0",
        '{"reward": 1.0',  # truncated
        "",
        '{"reward": ' + "9" * 5000 + "}",
    ],
)
def test_reward_json_garbage(text):
    with pytest.raises(ReportParseError):
        parse_reward_json(text)


@pytest.mark.parametrize(
    ("text", "status"),
    [
        ("1", "passed"),
        ("1.0\n", "passed"),
        ("  1.5  ", "passed"),
        ("1e0", "passed"),
        (".5", "failed"),
        ("0", "failed"),
        ("-1", "failed"),
        ("0.99999", "failed"),
        ("+1.", "passed"),
    ],
)
def test_reward_txt(text, status):
    assert _outcome(parse_reward_txt(text)) == status


@pytest.mark.parametrize(
    "text",
    ["", "   \n", "nan", "NaN", "inf", "-Infinity", "1e999", "1_000", "one", "1 1", "0x1", "1,0", "reward=1"],
)
def test_reward_txt_garbage(text):
    with pytest.raises(ReportParseError):
        parse_reward_txt(text)


@pytest.mark.parametrize(
    ("code", "status", "message"),
    [
        (0, "passed", ""),
        (1, "failed", "exit 1"),
        (2, "failed", "exit 2"),
        (137, "failed", "exit 137"),
        (-9, "failed", "exit -9"),
    ],
)
def test_from_exit_code(code, status, message):
    report = from_exit_code(code)
    assert report.format == "exit-code" and report.binary is True and report.source == "exit code"
    assert [(a.name, a.status, a.message) for a in report.assertions] == [("exit code", status, message)]
    assert report.resolved is (code == 0)


@pytest.mark.parametrize("code", [None, "0", 0.0, True])
def test_from_exit_code_rejects_non_int(code):
    with pytest.raises(ValueError, match=f"exit code must be an int, not {type(code).__name__}"):
        from_exit_code(code)
