"""``bench/dense_binary.py``: the intervals on known figures, what a batch gave PPO to learn from,
the tables on known results, and the command on a missing seed; the whole bench, shrunk, once
(slow)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT, load_bench

bench = load_bench("dense_binary")


def test_the_wilson_interval_on_known_figures():
    none, half, all_ = bench.wilson(0, 10), bench.wilson(5, 10), bench.wilson(10, 10)
    assert none.value == 0.0 and none.low == 0.0 and round(none.high, 4) == 0.2775
    assert (round(half.low, 4), round(half.high, 4)) == (0.2366, 0.7634)
    assert all_.high == pytest.approx(1.0) and round(all_.low, 4) == 0.7225
    assert str(half) == "50.0% [23.7%, 76.3%]"
    for bad in ((1, 0), (3, 2), (-1, 4)):
        with pytest.raises(ValueError, match="need 0 <= successes <= n"):
            bench.wilson(*bad)


def test_the_bootstrap_interval_is_reproducible_and_holds_the_mean():
    values = [0.0, 0.2, 0.4, 0.6, 1.0, 0.8, 0.2, 0.4]
    first, again = bench.bootstrap_mean(values), bench.bootstrap_mean(values)
    assert first == again and first.low < first.value < first.high and first.value == pytest.approx(0.45)
    assert bench.bootstrap_mean([0.5] * 6) == bench.Estimate(0.5, 0.5, 0.5)
    with pytest.raises(ValueError, match="no values"):
        bench.bootstrap_mean([])


def test_intervals_apart_only_when_they_do_not_overlap():
    assert bench.Estimate(0.5, 0.4, 0.6).apart_from(bench.Estimate(0.2, 0.1, 0.35))
    assert not bench.Estimate(0.5, 0.4, 0.6).apart_from(bench.Estimate(0.3, 0.2, 0.4))


def test_parts_are_counted_by_kind_from_their_assertions():
    from termgym.records import TrialRecord

    def record(*passed: tuple[str, bool]) -> TrialRecord:
        return TrialRecord(
            task="t", backend="local", agent="model", assertions=[{"name": name, "passed": ok} for name, ok in passed]
        )

    counts = bench.part_kinds(
        [
            record(("/app/a.txt holds exactly word", True), ("/app/b/c is a directory", False)),
            record(
                ("/app/d.txt has the content of /app/e.txt, which is still there", True),
                ("/app/f/g is a directory", True),
            ),
        ]
    )
    assert counts == {"write": [1, 1], "nest": [1, 2], "copy": [1, 1]}


def metrics(resolved: list[float], warmup: int = 2) -> list[dict]:
    return [
        {"warmup": i < warmup, "resolved": r, "reward_std": 0.1 * i, "passed": 2.0, "explained_variance": 0.5 + i}
        for i, r in enumerate(resolved)
    ]


def test_the_signal_counts_only_policy_updates():
    s = bench.signal(metrics([0.5, 0.5, 0.0, 0.25, 0.0, 1.0]))
    assert s["updates"] == 4 and s["no_resolved_share"] == 0.5 and s["flat_share"] == 0.0
    assert s["first_resolved"] == 0.5 and s["resolved_mean"] == pytest.approx(0.3125) and s["first_ev"] == 2.5
    assert s["passed_mean"] == 2.0 and s["resolved_by_update"] == [0.0, 0.25, 0.0, 1.0]
    flat = bench.signal([{**m, "reward_std": 0.0} for m in metrics([0.0, 0.0, 0.0])])
    assert flat["flat_share"] == 1.0 and flat["no_resolved_share"] == 1.0 and flat["first_ev"] is None


def result(seed: int, dense: list[bool], binary: list[bool], cold_ev: float | None = None) -> dict:
    def outcomes(flags: list[bool]) -> dict:
        return {f"t{i}": [flag, 1.0 if flag else 0.5] for i, flag in enumerate(flags)}

    arms = {"dense": bench.signal(metrics([0.0, 0.0, 0.1, 0.2])), "binary": bench.signal(metrics([0.0, 0.0, 0.0, 0.1]))}
    if cold_ev is not None:
        arms["cold-critic"] = bench.signal(metrics([0.0], warmup=0)) | {"first_ev": cold_ev}
    held = {"sft": outcomes([False] * len(dense)), "dense": outcomes(dense), "binary": outcomes(binary)}
    return {"seed": seed, "heldout": held, "arms": arms}


def test_the_table_gives_each_seed_pooled_and_the_paired_change():
    lines = bench.table(
        [
            result(0, [True] * 8 + [False] * 2, [False] * 9 + [True], 0.1),
            result(1, [True, False] * 5, [False] * 10, 0.3),
        ]
    ).splitlines()
    seed0 = lines[2].split(" | ")
    assert seed0[0] == "| 0" and seed0[1] == "10" and seed0[3] == "**80.0% [49.0%, 94.3%]**"
    assert seed0[5] == "+70.0%" and seed0[6] == "yes" and seed0[7].startswith("8 / 1 (p = ")
    assert lines[4].startswith("| pooled | 20 |") and "+60.0%" in lines[4] and "13 / 1" in lines[4]
    text = "\n".join(lines)
    assert "| 1 | dense | 2 | 0% | 0% | 0.0% | 15.0% | 2.00 | 2.50 |" in text
    assert "| 1 | binary | 2 | 50% | 0% | 0.0% | 5.0% | 2.00 | 2.50 |" in text
    assert (
        lines[-1].startswith("Explained variance at the first policy update")
        and "cold 0.10, 0.30 (mean 0.20)" in lines[-1]
    )
    with pytest.raises(ValueError, match="no seed"):
        bench.table([])


def test_the_command_names_a_missing_seed_in_one_line(tmp_path):
    script = [sys.executable, str(REPO_ROOT / "bench" / "dense_binary.py"), "--out", str(tmp_path)]
    (tmp_path / "seed0").mkdir()
    (tmp_path / "seed0" / "result.json").write_text(json.dumps(result(0, [True, False], [False, False])))
    done = subprocess.run([*script, "--seeds", "0", "--table-only"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.startswith("| seed | tasks |")
    missing = subprocess.run(
        [*script, "--seeds", "0", "5", "--table-only"], capture_output=True, text=True, check=False
    )
    assert (
        missing.returncode == 2
        and missing.stderr.strip() == f"seed 5: no finished run in {tmp_path / 'seed5'} (no result.json)"
    )


@pytest.mark.slow
def test_the_bench_shrunk_runs_both_arms_and_the_cold_critic_from_one_start(tmp_path):
    command = [sys.executable, "bench/dense_binary.py", "--quick", "--seeds", "0", "--critic", "--out", str(tmp_path)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False, timeout=1800)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads((tmp_path / "seed0" / "result.json").read_text())
    assert set(saved["arms"]) == {"dense", "binary", "cold-critic"} and set(saved["heldout"]) == {
        "sft",
        "dense",
        "binary",
    }
    assert all(len(outcomes) == 6 for outcomes in saved["heldout"].values())
    assert saved["arms"]["cold-critic"]["updates"] == 1 and saved["arms"]["dense"]["updates"] == 1
    # one supervised start: each arm's run starts from it
    for arm in ("dense", "binary", "cold-critic"):
        assert (tmp_path / "seed0" / arm / "policy").exists()
    assert done.stdout.startswith("| seed | tasks |") and "Explained variance at the first policy update" in done.stdout


def test_a_seed_run_apart_is_this_bench_with_the_same_flags_for_that_seed_alone():
    args = argparse.Namespace(out="runs/x", critic=True, teacher=False, quick=True, jobs=3)
    command = bench.child_command(args, 2)
    assert command[0] == sys.executable and command[1].endswith("bench/dense_binary.py")
    assert command[2:] == ["--seeds", "2", "--out", "runs/x", "--critic", "--quick"]


def test_jobs_below_one_is_refused_in_one_line(tmp_path):
    script = [sys.executable, str(REPO_ROOT / "bench" / "dense_binary.py"), "--out", str(tmp_path), "--jobs", "0"]
    done = subprocess.run(script, capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stderr.strip().endswith("--jobs must be at least 1")
    assert "Traceback" not in done.stderr
