"""``termgym report`` end to end: a real run (``termgym run`` on the embedded backend), its report
written by the CLI, and the page opened in a real headless Chromium (Debian's ``chromium``): the
DOM after the page's script ran has the summary, every trial row, a transcript command, the agent's
markup as text, and it sorts and filters from the address's fragment; a screenshot is kept."""

from __future__ import annotations

import os
from html.parser import HTMLParser
from pathlib import Path

import pytest

from termgym.cli.summary import summarize
from termgym.records import read_records
from tests.termgym.cli.run_report.helpers import BULK_RENAME, EVIL_OUTPUT, run_headless, termgym

pytestmark = pytest.mark.slow


class TrialRows(HTMLParser):
    """The trial table's rows as the DOM has them: status, hidden or not, sort value per column."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict] = []
        self.title = ""
        self.shown = ""
        self.elements: set[str] = set()
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.elements.add(f"{tag}#{a['id']}")
        if tag == "tr" and a.get("class") == "trial":
            self.rows.append({"status": a["data-status"], "hidden": "hidden" in a, "cells": []})
        elif tag == "td" and self.rows and "data-sort" in a and len(self.rows[-1]["cells"]) < 10:
            self.rows[-1]["cells"].append(a["data-sort"])
        elif tag == "title" or (tag == "span" and a.get("id") == "shown"):
            self._in = tag

    def handle_endtag(self, tag):
        if tag == self._in:
            self._in = None

    def handle_data(self, data):
        if self._in == "title":
            self.title += data
        elif self._in == "span":
            self.shown += data


def dom(chromium: str, page: Path, fragment: str, tmp_path: Path) -> tuple[str, TrialRows]:
    result = run_headless(chromium, page.as_uri() + fragment, tmp_path / "profile", "--dump-dom")
    with pytest.raises(ProcessLookupError):
        os.killpg(result.pgid, 0)  # nothing of Chromium's is left running
    parsed = TrialRows()
    parsed.feed(result.stdout)
    return result.stdout, parsed


@pytest.fixture(scope="module")
def report(run_dir: Path) -> Path:
    result = termgym("report", str(run_dir))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(run_dir / "report.html")
    return run_dir / "report.html"


def test_the_page_has_the_summary_the_rows_and_a_transcript(chromium, report, run_dir, tmp_path):
    records = read_records(run_dir / "trials.jsonl")
    assert len(records) == 8
    summary = summarize(records)
    assert summary["resolved_rate"] == 0.5  # the oracle's four, not the null agent's
    html, page = dom(chromium, report, "", tmp_path)
    assert 'data-ready="1"' in html  # the page's script ran
    assert f'data-value="{summary["resolved_rate"]}">50.0%<' in html
    assert f'data-value="{summary["pass_at_k"]["4"]}">' in html and "pass@4" in html  # -k 2, twice
    assert '<tr data-family="file-ops"><td>file-ops</td><td class="num">1</td><td class="num">4</td>' in html
    assert len(page.rows) == 8 and not any(r["hidden"] for r in page.rows)
    assert page.shown == "8 of 8 trials shown"
    assert [r["cells"][0] for r in page.rows] == [r["trial_id"] for r in records]  # record order
    assert "$ bash /solution/solve.sh" in html  # the oracle's command, in its transcript
    assert "1 passed, 4 failed, 0 skipped" in html  # the null agent's verifier output (bulk-rename)
    assert {"figure#chart-reward", "figure#chart-turns"} <= page.elements
    assert html.count('<rect class="bar" data-count="') == 10 + 2  # ten reward bins, turns 0 and 1


def test_the_agents_markup_shows_as_text_and_never_runs(chromium, report, tmp_path):
    html, page = dom(chromium, report, "", tmp_path)
    assert page.title.startswith("termgym report · ")  # the agent's script did not set it
    assert "PWNED" not in page.title
    assert "b#injected" not in page.elements and "img#evil-img" not in page.elements
    assert "&lt;script&gt;document.title='PWNED'&lt;/script&gt;" in html
    assert EVIL_OUTPUT not in html


def test_the_fragment_filters_and_sorts_the_table(chromium, report, tmp_path):
    _, failed = dom(chromium, report, "#status=failed", tmp_path)
    assert [r["status"] for r in failed.rows if not r["hidden"]] == ["failed"] * 4
    assert failed.shown == "4 of 8 trials shown"
    _, evil = dom(chromium, report, "#q=evil", tmp_path)
    visible = [r["cells"][1] for r in evil.rows if not r["hidden"]]
    assert len(visible) == 4 and all(task == "evil" for task in visible), visible
    _, by_reward = dom(chromium, report, "#sort=reward&desc=1", tmp_path)
    rewards = [float(r["cells"][5]) for r in by_reward.rows]
    assert rewards == sorted(rewards, reverse=True) and rewards[0] > rewards[-1]
    _, by_task = dom(chromium, report, "#sort=task&status=resolved", tmp_path)
    shown = [r["cells"][1] for r in by_task.rows if not r["hidden"]]
    assert shown == sorted(shown) and len(shown) == 4 and BULK_RENAME in shown


def test_a_screenshot_is_kept(chromium, report, tmp_path):
    shot = tmp_path / "report.png"
    run_headless(chromium, report.as_uri(), tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2000")
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 20_000  # a rendered page, not a blank one


def test_out_writes_where_asked_and_a_moved_run_keeps_its_transcripts(run_dir, tmp_path):
    moved = tmp_path / "moved"
    moved.mkdir()
    (moved / "trials.jsonl").write_text((run_dir / "trials.jsonl").read_text())
    os.symlink(run_dir / "trials", moved / "trials")
    target = tmp_path / "out" / "r.html"
    result = termgym("report", str(moved), "--out", str(target))
    assert result.returncode == 0 and result.stdout.strip() == str(target)
    text = target.read_text()
    assert "$ bash /solution/solve.sh" in text and "no transcript for this trial" not in text
    dir_out = termgym("report", str(moved), "--out", str(tmp_path))
    assert dir_out.returncode == 2 and "is a directory" in dir_out.stderr
