"""The evaluation summary: unbiased pass@k, Wilson intervals, infrastructure faults left out."""

from __future__ import annotations

import itertools
import math

import pytest

from termgym.cli.summary import pass_at_k, pass_at_k_table, summarize, wilson_interval


def record(task: str, resolved: bool, *, family: str = "f", error: str | None = None, **extra) -> dict:
    return {
        "task": task,
        "family": family,
        "resolved": resolved,
        "reward": 1.0 if resolved else 0.0,
        "passed": 2 if resolved else 1,
        "total": 2,
        "error": {"kind": error, "message": "x"} if error else None,
        **extra,
    }


@pytest.mark.parametrize(("n", "c", "k"), [(5, 2, 1), (5, 2, 3), (6, 1, 6), (4, 0, 2), (10, 7, 4)])
def test_pass_at_k_is_the_chance_that_k_of_the_n_trials_drawn_include_a_success(n, c, k):
    outcomes = [True] * c + [False] * (n - c)
    draws = list(itertools.combinations(outcomes, k))
    assert pass_at_k(n, c, k) == pytest.approx(sum(any(d) for d in draws) / len(draws))


def test_pass_at_1_is_the_resolved_fraction_and_bad_arguments_are_refused():
    assert pass_at_k(8, 3, 1) == pytest.approx(3 / 8)
    with pytest.raises(ValueError, match="pass@k needs 1 <= k <= n and 0 <= c <= n, got n=3 c=1 k=4"):
        pass_at_k(3, 1, 4)


def test_wilson_interval_holds_the_rate_and_matches_the_formula():
    low, high = wilson_interval(8, 10)
    assert low < 0.8 < high
    assert (low, high) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # the textbook Wilson interval for 8/10
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 20)[0] == 0.0 and wilson_interval(20, 20)[1] == 1.0


def test_pass_at_k_table_stops_at_the_fewest_trials_a_task_has():
    table = pass_at_k_table([[True, False, False], [False, False]])
    assert list(table) == ["1", "2"]
    assert table["1"] == pytest.approx((1 / 3 + 0) / 2)


def test_summary_leaves_infrastructure_faults_out_and_groups_by_family():
    records = [
        record("a", True, family="x", usage={"prompt_tokens": 10, "completion_tokens": 2, "requests": 1}),
        record("a", False, family="x", stop_reason="parse_errors", parse_errors=3),
        record("b", False, family="y", error="agent_timeout", stop_reason="agent_timeout"),
        record("b", True, family="y", error="model_error", stop_reason="model_error"),
        record("b", True, family="y", error="sandbox_error"),
    ]
    summary = summarize(records)
    assert summary["records"] == 5 and summary["scored"] == 3
    assert summary["excluded"] == {"model_error": 1, "sandbox_error": 1}
    assert summary["resolved_rate"] == pytest.approx(1 / 3)
    assert summary["pass_at_k"] == {"1": pytest.approx((0.5 + 0.0) / 2)}
    assert summary["families"]["x"]["pass_at_k"] == {"1": 0.5, "2": 1.0}
    assert summary["families"]["y"]["trials"] == 1
    assert summary["mean_assertions_passed"] == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert summary["parse_errors"] == 3 and summary["usage"] == {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "requests": 1,
    }
    assert summary["stop_reasons"]["model_error"] == 1
    assert math.isclose(sum(summary["resolved_ci95"]) / 2, 0.4, abs_tol=0.2)
