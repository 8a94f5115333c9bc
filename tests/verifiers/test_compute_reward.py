"""The reward function: dense passed/scale, binary 0/1, errors 0."""

import re

import pytest

from termgym.verifiers import (
    DEFAULT_SCALE,
    Assertion,
    AssertionReport,
    compute_reward,
    from_exit_code,
    parse_reward_txt,
)
from termgym.verifiers.report import Status


def _dense(passed: int, failed: int = 0, skipped: int = 0, error: str | None = None) -> AssertionReport:
    counts: dict[Status, int] = {"passed": passed, "failed": failed, "skipped": skipped}
    # the passes, then the failures, then the skips
    statuses: list[Status] = [status for status, n in counts.items() for _ in range(n)]
    assertions = tuple(Assertion(name=f"t{i}", status=s) for i, s in enumerate(statuses))
    return AssertionReport(format="ctrf", assertions=assertions, binary=False, source="ctrf.json", error=error)


@pytest.mark.parametrize(
    ("report", "scale", "reward"),
    [
        (_dense(0), 20, 0.0),
        (_dense(1), 20, 0.05),
        (_dense(10), 20, 0.5),
        (_dense(20), 20, 1.0),
        (_dense(25), 20, 1.25),  # not capped at 1
        (_dense(3, failed=7), 20, 0.15),  # failures cost nothing: not a pass ratio (that would be 0.3)
        (_dense(1, failed=0), 20, 0.05),  # a single pass is not 1.0 either
        (_dense(4, skipped=6), 20, 0.2),  # skipped counts neither way
        (_dense(0, skipped=5), 20, 0.0),
        (_dense(3, failed=1), 4, 0.75),
        (_dense(3, failed=1), 1, 3.0),
        (_dense(20, error="unparseable report ctrf.json: x"), 20, 0.0),  # error wins over any count
    ],
)
def test_dense_reward(report, scale, reward):
    assert compute_reward(report, scale) == pytest.approx(reward)


def test_default_scale_is_20():
    assert DEFAULT_SCALE == 20
    assert compute_reward(_dense(5)) == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("report", "reward"),
    [
        (from_exit_code(0), 1.0),
        (from_exit_code(1), 0.0),
        (parse_reward_txt("1.0"), 1.0),
        (parse_reward_txt("0.7"), 0.0),
        (parse_reward_txt("3"), 1.0),  # binary: a reward above 1 is still 1.0
        (
            AssertionReport(
                format="exit-code",
                assertions=(Assertion("exit code", "passed"),),
                binary=True,
                error="verifier produced no result",
            ),
            0.0,
        ),
        (AssertionReport(format="reward-file", assertions=(), binary=True), 0.0),  # nothing counted
    ],
)
def test_binary_reward(report, reward):
    assert compute_reward(report) == reward
    assert compute_reward(report, scale=1) == reward  # the scale does not apply to binary reports


@pytest.mark.parametrize("scale", [0, -20, 2.5, 20.0, "20", None, True])
def test_scale_must_be_a_positive_int(scale):
    with pytest.raises(ValueError, match=re.escape(f"scale must be a positive int, not {scale!r}")):
        compute_reward(_dense(1), scale)


def test_report_must_be_an_assertion_report():
    with pytest.raises(ValueError, match="report must be an AssertionReport, not dict"):
        compute_reward({"passed": 3})  # pyright: ignore[reportArgumentType]  # deliberately the wrong type: the validation is under test
