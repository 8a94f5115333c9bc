"""The page (pure rendering): everything from records and transcripts is escaped, nothing is
loaded from anywhere, and a run of 10,000 trials stays a page a browser can open."""

from __future__ import annotations

import re
import time

from termgym.cli.run_report.data import COLUMNS, Caps, caps_for, report_data, reward_bins, trial_view
from termgym.cli.run_report.html import bar_chart, render

EVIL = "<script>alert(1)</script>"


def record(i: int, **fields):
    base = {
        "task": f"t/task-{i % 7}",
        "trial_id": f"id{i}",
        "family": f"fam{i % 3}",
        "agent": "oracle",
        "resolved": i % 2 == 0,
        "reward": (i % 11) / 10,
        "passed": i % 5,
        "total": 4,
        "turns": i % 13,
        "timings": {"total": 1.5},
    }
    return {**base, **fields}


def transcript(output: str, steps: int = 2):
    turns = [
        {
            "index": n,
            "reply": None,
            "action": {"kind": "command", "command": f"echo {EVIL}"},
            "result": {"output": output, "exit_code": 0, "duration": 0.5},
            "observation": output,
        }
        for n in range(steps)
    ]
    return {"schema": "termgym.transcript/1", "instruction": EVIL, "turns": turns, "stop_reason": "submitted"}


def page(records, transcripts, caps=None):
    caps = caps or caps_for(len(records))
    trials = [trial_view(i, r, t, caps) for i, (r, t) in enumerate(zip(records, transcripts, strict=True))]
    return render(report_data("run<1>", records, trials))


def test_every_text_from_the_agent_or_the_task_is_escaped():
    evil_record = record(
        0,
        task=f"t/{EVIL}",
        assertions=[{"name": EVIL, "passed": False, "message": EVIL}],
        logs={"verifier": EVIL, "build": EVIL},
        error={"kind": "agent_timeout", "message": EVIL},
        warnings=[EVIL],
        family=EVIL,
    )
    text = page([evil_record], [transcript(EVIL)])
    assert "alert(1)" in text
    assert EVIL not in text  # never as markup...
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # ...always as text
    assert text.count("<script>") == 1  # the page's own
    assert "termgym report · run&lt;1&gt;" in text


def test_the_page_loads_nothing_from_anywhere():
    text = page([record(0)], [transcript("ok")])
    assert not re.search(r"<(link|img|iframe|object|embed)\b", text)
    assert not re.search(r"\b(src|href)=\"(?!#)", text)  # only in-page links
    assert re.findall(r"https?://[^\"' ]+", text) == ["http://www.w3.org/2000/svg"] * 2  # SVG namespaces
    assert "default-src 'none'" in text


def test_one_row_and_one_collapsed_details_per_trial():
    records = [record(i) for i in range(5)]
    text = page(records, [None] * 5)
    assert text.count('<tr class="trial"') == 5
    assert text.count('<details class="trial"') == 5 and '<details class="trial" open' not in text
    assert text.count('<td data-sort="') == 5 * len(COLUMNS)
    assert "no transcript for this trial" in text


def test_pass_at_k_shows_only_when_tasks_ran_more_than_once():
    once = page([record(0)], [None])
    assert 'id="card-pass-at' not in once and "pass@2" not in once
    twice = page([record(0), record(7)], [None, None])  # task-0 twice
    assert 'id="card-pass-at-2"' in twice and '<th class="num">pass@2</th>' in twice


def test_a_cut_says_how_much_it_left_out():
    text = page([record(0)], [transcript("z" * 10_000, steps=1)], Caps(step_chars=1000, trial_chars=2000))
    assert "… 9,000 characters cut …" in text


def test_bars_are_proportional_to_their_counts():
    svg = bar_chart(reward_bins([0.0, 0.0, 0.55, 1.0]), "reward", "c")
    heights = [float(h) for h in re.findall(r'<rect class="bar" data-count="\d+" [^>]*height="([\d.]+)"', svg)]
    counts = [int(c) for c in re.findall(r'data-count="(\d+)"', svg)]
    assert counts == [2, 0, 0, 0, 0, 1, 0, 0, 0, 1]
    assert heights[0] == 2 * heights[5] == 2 * heights[9] and heights[1] == 0


def test_ten_thousand_trials_stay_a_page_a_browser_opens():
    n = 10_000
    records = [record(i) for i in range(n)]
    big = transcript("x" * 100_000, steps=50)  # 5 MB of output per trial before the caps
    started = time.monotonic()
    text = page(records, [big] * n)
    elapsed = time.monotonic() - started
    assert text.count('<tr class="trial"') == n
    assert len(text) < 40_000_000, len(text)
    assert "characters cut" in text and "steps cut" in text
    assert elapsed < 60, elapsed
