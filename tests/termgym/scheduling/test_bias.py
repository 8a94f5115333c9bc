from __future__ import annotations

import math
import os
import random
import subprocess
import sys

import pytest

from termgym.sandboxes.pacing import Window, default_windows
from termgym.scheduling import bias
from termgym.scheduling.bias import Fate, TrialOutcome


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ({}, {}),
        ({"a": 0, "b": 0}, {"a": 0.0, "b": 0.0}),
        ({"a": 1}, {"a": 1.0}),
        ({"a": 3, "b": 1}, {"a": 0.75, "b": 0.25}),
        ({"a": 0.5, "b": 1.5}, {"a": 0.25, "b": 0.75}),
    ],
)
def test_shares(counts, expected):
    assert bias.shares(counts) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("p", "q", "expected"),
    [
        ({"a": 0.5, "b": 0.5}, {"a": 0.5, "b": 0.5}, 0.0),
        ({"a": 1.0}, {"b": 1.0}, 1.0),  # disjoint
        ({"a": 0.25, "b": 0.75}, {"a": 0.20, "b": 0.80}, 0.05),
        ({"a": 0.5, "b": 0.3, "c": 0.2}, {"a": 0.6, "b": 0.4}, 0.2),  # a group missing on one side counts 0
        ({}, {}, 0.0),
    ],
)
def test_total_variation(p, q, expected):
    assert bias.total_variation(p, q) == pytest.approx(expected)
    assert bias.total_variation(q, p) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("launched", "kept", "expected"),
    [
        ({"a": 50, "b": 50}, {"a": 20, "b": 20}, {"a": 1.0, "b": 1.0}),  # no bias: no correction
        ({"a": 50, "b": 50}, {"a": 30, "b": 10}, {"a": 2 / 3, "b": 2.0}),
        (
            {"short": 420, "long": 140},
            {"short": 410, "long": 102},
            {"short": (420 / 560) / (410 / 512), "long": (140 / 560) / (102 / 512)},
        ),
        # a group launched but never kept cannot be restored: the others share its mass
        ({"a": 50, "b": 25, "c": 25}, {"a": 10, "b": 10}, {"a": (2 / 3) / 0.5, "b": (1 / 3) / 0.5}),
        ({"a": 0}, {"a": 5}, {"a": 1.0}),  # nothing launched among kept groups (all carried in)
        ({"a": 5}, {}, {}),
    ],
)
def test_importance_weights(launched, kept, expected):
    assert bias.importance_weights(launched, kept) == pytest.approx(expected)


def test_importance_weights_restore_the_launched_mix_with_mean_one():
    rng = random.Random(7)
    for _ in range(200):
        groups = [f"g{i}" for i in range(rng.randint(1, 6))]
        launched = {g: rng.randint(1, 200) for g in groups}
        kept = {g: rng.randint(1, launched[g]) for g in groups}
        weights = bias.importance_weights(launched, kept)
        weighted = bias.shares({g: kept[g] * weights[g] for g in groups})
        assert weighted == pytest.approx(bias.shares(launched))
        assert sum(kept[g] * weights[g] for g in groups) == pytest.approx(sum(kept.values()))


@pytest.mark.parametrize(
    ("weights", "expected"),
    [([], 0.0), ([1.0] * 10, 10.0), ([2.0, 2.0], 2.0), ([1.0, 0.0], 1.0), ([3.0, 1.0], 16 / 10)],
)
def test_effective_sample_size(weights, expected):
    assert bias.effective_sample_size(weights) == pytest.approx(expected)


@pytest.mark.parametrize(("batch", "expected"), [(512, 560), (1, 2), (64, 70), (100, 110), (1024, 1120)])
def test_launch_count_follows_the_published_ratio(batch, expected):
    assert bias.launch_count(batch) == expected


def test_launch_count_rejects_an_empty_batch():
    with pytest.raises(ValueError, match="the batch size must be at least 1, got 0"):
        bias.launch_count(0)


@pytest.mark.parametrize(
    ("n", "windows", "expected"),
    [
        (0, default_windows(), 0.0),
        (1, default_windows(), 0.0),
        (6, default_windows(), 0.0),
        (7, default_windows(), 1.0),
        (560, default_windows(), 93.0),  # 6/s binds; 600/min never does at 6/s
        (600, (Window(20, 1.0), Window(600, 60.0)), 29.0),
        (601, (Window(20, 1.0), Window(600, 60.0)), 60.0),  # the minute window binds
    ],
)
def test_pacing_seconds(n, windows, expected):
    assert bias.pacing_seconds(n, windows) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("pacing", "durations", "expected"),
    [(93.0, [10.0, 700.0, 20.0], 700.0), (93.0, [10.0, 20.0], 93.0), (0.0, [], 0.0), (5.0, [], 5.0)],
)
def test_step_lower_bound(pacing, durations, expected):
    assert bias.step_lower_bound(pacing, durations) == expected


def outcome(
    task: str,
    family: str,
    fate: Fate,
    duration: float = 10.0,
    turns: int = 2,
    launched: bool = True,
    weight: float = 1.0,
) -> TrialOutcome:
    return TrialOutcome(task, family, fate, launched, duration, turns, weight)


STEP = [
    outcome("s1", "short", "kept", 10, 2),
    outcome("s1", "short", "kept", 30, 4),
    outcome("s2", "short", "surplus", 20, 3),
    outcome("s2", "short", "failed", 1, 0),
    outcome("l1", "long", "kept", 50, 6),
    outcome("l1", "long", "cancelled", 60, 5),
    outcome("l2", "long", "carried", 40, 4),
    outcome("l2", "long", "kept", 90, 9, launched=False),  # carried in from an earlier step
]


def test_tally_counts_each_fate_per_family():
    groups = bias.tally(STEP)
    assert list(groups) == ["long", "short"]
    short, long = groups["short"], groups["long"]
    assert (short.launched, short.finished, short.kept, short.cancelled, short.failed, short.carried) == (
        4,
        3,
        2,
        0,
        1,
        0,
    )
    assert (long.launched, long.finished, long.kept, long.cancelled, long.failed, long.carried) == (3, 2, 2, 1, 0, 1)
    assert (
        long.kept_seconds == 140
        and long.launched_seconds == 150
        and long.kept_turns == 15
        and long.launched_turns == 15
    )


def test_tally_per_task():
    groups = bias.tally(STEP, key=lambda o: o.task)
    assert {name: g.launched for name, g in groups.items()} == {"l1": 2, "l2": 1, "s1": 2, "s2": 2}


def test_bias_report_shares_distance_and_means():
    report = bias.bias_report(bias.tally(STEP))
    assert report.launched_share == pytest.approx({"short": 4 / 7, "long": 3 / 7})
    assert report.kept_share == pytest.approx({"short": 0.5, "long": 0.5})
    assert report.weighted_share == report.kept_share
    assert report.tv_distance == pytest.approx(4 / 7 - 0.5)
    assert report.mean_seconds_kept == pytest.approx((10 + 30 + 50 + 90) / 4)
    assert report.mean_seconds_launched == pytest.approx((10 + 30 + 20 + 1 + 50 + 60 + 40) / 7)
    assert report.mean_turns_kept == pytest.approx((2 + 4 + 6 + 9) / 4)
    assert report.totals.kept == 4 and report.totals.launched == 7
    assert report.longest() == "long"


def test_weighted_share_uses_the_weights():
    outcomes = [
        outcome("a", "a", "kept", weight=0.5),
        outcome("a", "a", "kept", weight=0.5),
        outcome("b", "b", "kept", weight=2.0),
    ]
    report = bias.bias_report(bias.tally(outcomes))
    assert report.weighted_share == pytest.approx({"a": 1 / 3, "b": 2 / 3})
    assert report.kept_share == pytest.approx({"a": 2 / 3, "b": 1 / 3})


def test_empty_report_has_no_means():
    report = bias.bias_report({})
    assert report.tv_distance == 0.0 and math.isnan(report.mean_seconds_kept) and report.longest() is None


def test_merge_adds_counts_and_keeps_only_the_latest_carried():
    first = bias.tally([outcome("l", "long", "carried"), outcome("s", "short", "kept")])
    second = bias.tally([outcome("l", "long", "kept", launched=False), outcome("x", "new", "carried")])
    merged = bias.merge_tallies(first, second)
    assert merged["long"].launched == 1 and merged["long"].kept == 1 and merged["long"].carried == 0
    assert merged["short"].kept == 1 and merged["new"].carried == 1


def test_unknown_fate_is_rejected():
    with pytest.raises(ValueError, match="fate"):
        outcome("a", "a", "lost")  # pyright: ignore[reportArgumentType]  # deliberately the wrong type: the validation is under test


def test_report_serializes_per_group():
    data = bias.bias_report(bias.tally(STEP)).to_dict()
    assert data["groups"]["long"]["kept"] == 2 and data["groups"]["long"]["launched_share"] == pytest.approx(3 / 7)
    assert "launched_share" not in data and data["tv_distance"] == pytest.approx(4 / 7 - 0.5)


def test_table_rows_and_summary_line():
    report = bias.bias_report(bias.tally(STEP))
    rows = bias.table_rows(report)
    assert [row[0] for row in rows] == ["long", "short", "all"]
    assert all(len(row) == len(bias.TABLE_COLUMNS) for row in rows)
    assert rows[0][7:9] == ("42.9", "50.0")
    line = bias.summary_line(3, "cancel", report, report, wall=110.0, bound=100.0)
    assert "step 3 · cancel · kept 4 · launched 7 · cancelled 1 · failed 1 · carried 1" in line
    assert "x1.10" in line and "long 42.9% launched → 50.0% kept" in line


def test_total_variation_is_the_same_float_whatever_the_string_hashing():
    # A set of names iterates in an order that PYTHONHASHSEED decides, and a float sum depends on
    # its order (0.1 + 0.2 + 0.3 is not 0.3 + 0.2 + 0.1): two runs of one seed must log the same figure.
    code = (
        "from termgym.scheduling import bias; "
        "p = {f'family-{i}': 0.1 * i for i in range(1, 12)}; "
        "print(repr(bias.total_variation(p, {})))"
    )
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2", "3", "4")
    }
    assert len(seen) == 1
