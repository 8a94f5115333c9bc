"""``bench/main_job_band.py``: a seed's row from its summary, the band's table on known figures
(mean, min, max, the teacher's verdict), and the command on finished runs and on missing ones."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT, load_bench

band = load_bench("main_job_band")


def summary(start: float, ppo: float, teacher: float, gained: int, lost: int, p: float = 1e-3) -> dict:
    heldout = {
        name: {"resolved": rate, "tasks": 192} for name, rate in (("sft", start), ("ppo", ppo), ("teacher", teacher))
    }
    return {"heldout": {**heldout, "change": {"gained": gained, "lost": lost, "p_value": p}}}


def test_a_seed_row_reads_the_summary():
    row = band.seed_result(3, summary(0.2, 0.5, 0.45, 60, 2), 600.0)
    assert (row.seed, row.start, row.ppo, row.teacher, row.gained, row.lost, row.tasks) == (
        3,
        0.2,
        0.5,
        0.45,
        60,
        2,
        192,
    )
    assert row.beats_teacher and row.seconds == 600.0


def test_the_table_gives_each_seed_then_mean_min_max_and_says_where_ppo_stayed_behind():
    rows = [
        band.seed_result(0, summary(0.20, 0.50, 0.40, 60, 2), 420.0),
        band.seed_result(1, summary(0.10, 0.30, 0.45, 30, 4)),
    ]
    lines = band.table(rows).splitlines()
    assert lines[2] == "| 0 | 20.0% | **50.0%** | 40.0% | 60 / 2 (p = 1e-03) | 7.0 min |"
    assert lines[3].startswith("| 1 | 10.0% | **30.0%** | 45.0% | 30 / 4 ") and lines[3].endswith("|  |")
    assert lines[4] == "| mean | 15.0% | 40.0% | 42.5% | 45.0 / 3.0 | |"
    assert lines[5] == "| min | 10.0% | 30.0% | 40.0% | 30 / 2 | |"
    assert lines[6] == "| max | 20.0% | 50.0% | 45.0% | 60 / 4 | |"
    assert lines[-1].startswith("PPO beat the teacher on 1 of 2 seeds; not on seed 1.")
    every = band.table(rows[:1]).splitlines()[-1]
    assert every.startswith("PPO beat the teacher on every seed (1 of 1).") and "192 tasks" in every


def test_an_empty_band_is_refused():
    with pytest.raises(ValueError, match="no seed"):
        band.table([])


def test_the_command_tabulates_finished_runs_and_names_a_missing_one(tmp_path):
    for seed, rates in ((0, (0.2, 0.5, 0.4, 60, 2)), (1, (0.3, 0.6, 0.5, 50, 1))):
        (tmp_path / f"band-{seed}").mkdir()
        (tmp_path / f"band-{seed}" / "summary.json").write_text(json.dumps(summary(*rates)))
    script = [sys.executable, str(REPO_ROOT / "bench" / "main_job_band.py"), "--out", str(tmp_path / "band")]
    done = subprocess.run([*script, "--seeds", "0", "1", "--table-only"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "| 1 | 30.0% | **60.0%** | 50.0% |" in done.stdout
    assert "every seed (2 of 2)" in done.stdout
    missing = subprocess.run(
        [*script, "--seeds", "0", "7", "--table-only"], capture_output=True, text=True, check=False
    )
    assert missing.returncode == 2 and missing.stderr.strip().startswith("seed 7: no finished run")
    assert "Traceback" not in missing.stderr
    (tmp_path / "band-8").mkdir()
    (tmp_path / "band-8" / "audit.json").write_text("[]")
    unfinished = subprocess.run([*script, "--seeds", "8"], capture_output=True, text=True, check=False)
    assert unfinished.returncode == 2 and "holds an unfinished run" in unfinished.stderr
