"""The report's data (pure): clips, histogram bins, statuses and sort values, where transcripts are
looked for, and how a transcript is cut to the caps."""

from __future__ import annotations

from pathlib import Path

import pytest

from termgym.cli.run_report.data import (
    COLUMNS,
    Caps,
    Clip,
    caps_for,
    clip,
    histogram,
    report_data,
    reward_bins,
    sort_values,
    transcript_candidates,
    transcript_view,
    trial_status,
    trial_view,
    turn_bins,
)


def record(**fields):
    base = {"task": "t/a", "trial_id": "abc", "family": "f", "agent": "oracle", "reward": 0.0, "turns": 0}
    return {**base, **fields}


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [
        ("", 10, Clip("")),
        (None, 10, Clip("")),
        ("abcdef", 6, Clip("abcdef")),
        ("abcdefghij", 4, Clip("ab", "ij", 6)),
        ("abcdefghij", 5, Clip("ab", "hij", 5)),
    ],
)
def test_a_clip_keeps_head_and_tail_and_counts_the_cut(text, limit, expected):
    got = clip(text, limit)
    assert got == expected
    assert len(got.text) + got.cut == len(text or "")


def test_a_clip_needs_room_for_a_head_and_a_tail():
    with pytest.raises(ValueError, match="at least 2"):
        clip("abc", 1)


def test_histogram_counts_every_value_once_and_clamps_outliers():
    bins = histogram([-1, 0, 0.5, 0.99, 1, 1, 7], [0, 0.5, 1])
    assert [b.count for b in bins] == [2, 5]
    assert [b.label for b in bins] == ["0–0.5", "0.5–1"]


@pytest.mark.parametrize("edges", [[0], [0, 0], [1, 0.5, 2]])
def test_histogram_edges_must_increase(edges):
    with pytest.raises(ValueError, match="increasing"):
        histogram([1], edges)


def test_reward_bins_are_ten_tenths_with_a_perfect_reward_in_the_last():
    bins = reward_bins([0.0, 0.05, 0.1, 0.95, 1.0])
    assert len(bins) == 10
    assert bins[0].label == "0.0–0.1" and bins[-1].label == "0.9–1.0"
    assert [b.count for b in bins] == [2, 1, 0, 0, 0, 0, 0, 0, 0, 2]


def test_turn_bins_are_one_per_count_while_few():
    bins = turn_bins([0, 1, 1, 3])
    assert [(b.label, b.count) for b in bins] == [("0", 1), ("1", 2), ("2", 0), ("3", 1)]


def test_turn_bins_widen_past_the_most_bins():
    bins = turn_bins([0, 9, 10, 99], most_bins=10)
    assert len(bins) == 10
    assert bins[0].label == "0–9" and bins[-1].label == "90–99"
    assert [b.count for b in bins][:2] == [2, 1] and bins[-1].count == 1
    assert turn_bins([])[0].label == "0"


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"resolved": True}, "resolved"),
        ({"resolved": False}, "failed"),
        ({"error": {"kind": "agent_timeout", "message": "x"}}, "failed"),
        ({"error": {"kind": "sandbox_error", "message": "x"}}, "excluded"),
        ({"error": {"kind": "build_failed", "message": "x"}, "resolved": True}, "excluded"),
    ],
)
def test_trial_status(fields, status):
    assert trial_status(record(**fields)) == status


def test_sort_values_cover_every_column_and_order_statuses():
    values = sort_values(record(passed=3, total=4, timings={"total": 2.5}, error={"kind": "agent_timeout"}))
    assert set(values) == {key for key, _, _ in COLUMNS}
    assert values["assertions"] == 0.75 and values["seconds"] == 2.5 and values["error"] == "agent_timeout"
    assert sort_values(record())["assertions"] == -1.0
    statuses = [
        sort_values(record(resolved=True))["status"],
        sort_values(record())["status"],
        sort_values(record(error={"kind": "sandbox_error"}))["status"],
    ]
    assert statuses == sorted(statuses)
    for key, _, numeric in COLUMNS:
        assert isinstance(values[key], float) == numeric, key


def test_transcript_candidates_prefer_the_run_dirs_own_copy(tmp_path: Path):
    run = tmp_path / "runs" / "r1"
    relative = record(transcript="runs/r1/trials/abc/trajectory.json")
    assert transcript_candidates(relative, run, Path("/elsewhere")) == [
        run / "trials" / "abc" / "trajectory.json",
        Path("/elsewhere/runs/r1/trials/abc/trajectory.json"),
        tmp_path / "runs" / "runs/r1/trials/abc/trajectory.json",
    ]
    absolute = record(transcript="/old/place/trajectory.json")
    assert transcript_candidates(absolute, run, tmp_path)[1] == Path("/old/place/trajectory.json")
    assert transcript_candidates({"task": "t"}, run, tmp_path) == []


def turn(index, command, output):
    return {
        "index": index,
        "reply": None,
        "action": {"kind": "command", "command": command},
        "result": {"output": output, "exit_code": 0, "duration": 0.1},
        "observation": output,
    }


def test_transcript_view_cuts_long_outputs_and_middle_steps():
    turns = [turn(i, f"echo {i}", "x" * 1000) for i in range(10)]
    view = transcript_view(
        {"turns": turns, "stop_reason": "max_turns"}, Caps(step_chars=300, trial_chars=10_000, steps=4)
    )
    assert [s.index for s in view.steps] == [0, 1, 8, 9]
    assert view.steps_cut == 6 and view.cut_after == 2
    output = view.steps[0].output
    assert output is not None and len(output.text) == 300 and output.cut == 700
    assert view.steps[0].observation is None  # the same as the output: not shown twice
    assert view.stop_reason == "max_turns"


def test_transcript_view_shares_the_trial_budget_between_steps():
    turns = [turn(i, "ls", "y" * 1000) for i in range(10)]
    view = transcript_view({"turns": turns}, Caps(step_chars=1000, trial_chars=4000, steps=100))
    assert all(s.output is not None and len(s.output.text) == 200 for s in view.steps)  # 4000 / (2 * 10)
    assert len(view.steps) == 10
    few = transcript_view({"turns": turns * 3}, Caps(step_chars=1000, trial_chars=4000, steps=100))
    assert len(few.steps) == 10 and few.steps_cut == 20  # 4000 // (2 * MIN_STEP_CHARS) steps at most


def test_transcript_view_notes_a_missing_or_unreadable_transcript():
    assert transcript_view(None, Caps()).note == "no transcript for this trial"
    assert transcript_view("transcript unreadable: x", Caps()).note == "transcript unreadable: x"


def test_caps_shrink_with_the_run_but_keep_a_floor():
    assert caps_for(1) == Caps()
    big = caps_for(10_000)
    assert big.trial_chars * 10_000 <= 20_000_000
    assert caps_for(10_000_000).trial_chars == 2_000


def test_report_data_summarizes_and_bins_scored_trials_only():
    records = [
        record(trial_id="a", resolved=True, reward=1.0, turns=2),
        record(trial_id="b", reward=0.0, turns=5),
        record(trial_id="c", error={"kind": "sandbox_error", "message": "boom"}, reward=0.0, turns=9),
    ]
    trials = [trial_view(i, r, None, Caps()) for i, r in enumerate(records)]
    data = report_data("run", records, trials)
    assert data.summary["resolved_rate"] == 0.5 and data.summary["excluded"] == {"sandbox_error": 1}
    assert sum(b.count for b in data.rewards) == 2 and data.rewards[-1].count == 1
    assert len(data.turns) == 6  # 0..5: the excluded trial's 9 turns are not binned
    assert data.k == 2  # two scored trials of one task
    assert trials[2].status == "excluded" and "boom" in trials[2].search
