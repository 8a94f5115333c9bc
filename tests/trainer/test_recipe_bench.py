"""``bench/recipe.py``: which arms each comparison needs, the shared critic warm-up's size, the
table's arithmetic on known results, and a shortened run end to end (the CI's recipe run)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import REPO_ROOT, load_bench

recipe = load_bench("recipe")


def test_each_comparison_runs_only_the_arms_it_reads():
    assert recipe.arms_for([1]) == ["dense", "binary"]
    assert recipe.arms_for([2]) == ["dense", "cold-critic"]
    assert recipe.arms_for([4]) == ["reweight", "cancel", "carry-over"]
    assert recipe.arms_for([5, 1]) == ["dense", "binary", "group"]
    assert recipe.arms_for(sorted(recipe.COMPARISONS)) == list(recipe.ARMS)
    # every arm with a warm critic continues from a warm-up on its own reward
    assert {a.name: a.warmup for a in recipe.ARMS.values()} == {
        "dense": "warmup-dense",
        "binary": "warmup-binary",
        "cold-critic": None,
        "reweight": "warmup-dense",
        "cancel": "warmup-dense",
        "carry-over": "warmup-dense",
        "group": None,
    }


def test_the_warm_up_scales_with_the_pool():
    assert recipe.warmup_steps_for(600, 32, 0.25) == 5  # 150 tasks' worth of rollouts, in whole steps
    assert recipe.warmup_steps_for(600, 32, 1.0) == 19  # one epoch
    assert recipe.warmup_steps_for(3, 32, 0.25) == 1  # never none


def metrics_step(reward: float, ev: float | None, warmup: bool, kept: float = 0.2, weighted: float = 0.25) -> dict:
    groups = {
        "copy-chain": {
            "launched": 10,
            "launched_seconds": 50.0,
            "launched_share": 0.25,
            "kept_share": kept,
            "weighted_share": weighted,
        },
        "file-set": {
            "launched": 10,
            "launched_seconds": 10.0,
            "launched_share": 0.75,
            "kept_share": 1 - kept,
            "weighted_share": 1 - weighted,
        },
    }
    return {
        "reward": reward,
        "explained_variance": ev,
        "warmup": warmup,
        "scheduler": {"families": {"groups": groups}, "run": {"families": {"groups": groups}}},
    }


def heldout(resolved: float, share: float, rates: dict[str, float]) -> dict:
    return {
        "tasks": 2,
        "resolved": resolved,
        "passed": 5.0,
        "reward": 0.2,
        "errors": 0,
        "families": {"copy-chain": {"tasks": 1, "resolved": resolved, "passed": 5.0}},
        "task_rates": rates,
        "samples": 0,
        "passed_share": share,
    }


def test_the_table_reads_the_policy_updates_only_and_sums_flips_over_seeds():
    def seed(dense_ev: float) -> dict:
        return {
            "sft": {"heldout": heldout(0.0, 0.3, {"a": 0.0, "b": 1.0}), "long_steps": 100 if dense_ev < 0.5 else 140},
            "dense": {
                "metrics": [metrics_step(0.1, -5.0, True), metrics_step(0.4, dense_ev, False)],
                "heldout": heldout(0.5, 0.6, {"a": 1.0, "b": 1.0}),
            },
            "cold-critic": {"metrics": [metrics_step(0.2, 0.0, False)]},
            "reweight": {"metrics": [metrics_step(0.4, 0.3, False)], "heldout": heldout(0.5, 0.6, {})},
            "cancel": {"metrics": [metrics_step(0.3, 0.1, False, kept=0.2)], "heldout": heldout(0.0, 0.3, {})},
            "carry-over": {"metrics": [metrics_step(0.3, 0.1, False, kept=0.24)], "heldout": heldout(0.5, 0.3, {})},
        }

    rows = recipe.figures([seed(0.4), seed(0.6)], [2, 4])
    by_measure = {(r[1]): r[2:] for r in rows}
    assert by_measure["steps on the long pool, to the validation share"][0] == "120 ± 28"
    assert by_measure["EV at the first policy update"][:2] == ("0.500 ± 0.141", "0.000 ± 0.000")  # -5 is warm-up
    assert by_measure["training reward over the policy updates"][:2] == ("0.400 ± 0.000", "0.200 ± 0.000")
    assert by_measure["copy-chain: launched share"] == ("0.250 ± 0.000",) * 3
    # reweight's weighted share, cancel's and carry-over's kept shares
    assert by_measure["copy-chain: kept share (reweight: weighted)"] == (
        "0.250 ± 0.000",
        "0.200 ± 0.000",
        "0.240 ± 0.000",
    )
    flips = recipe.figures([seed(0.4), seed(0.6)], [1])
    assert any(r[2] == "2 / 0 (p = 0.500)" for r in flips)  # task "a" gained in each of the two seeds


@pytest.mark.slow
def test_a_shortened_recipe_run_writes_its_table_json_and_plots(tmp_path, no_leaks):
    out = tmp_path / "recipe"
    command = [sys.executable, "bench/recipe.py", "--quick", "--seeds", "0", "--only", "1", "2", "4", "--out", str(out)]
    done = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    # each reward's warm-up ran once for the seed, and each arm with a warm critic continued from it
    assert done.stderr.count("seed 0 · warmup-dense:") == 1 and done.stderr.count("seed 0 · warmup-binary:") == 1
    result = json.loads((out / "recipe.json").read_text())
    measures = [row[1] for row in result["rows"]]
    assert "EV at the first policy update" in measures and "held-out share of assertions" in measures
    assert result["warmup_steps"] == 1
    assert all((out / f"comparison-{n}.png").stat().st_size > 1000 for n in (1, 2, 4))
    dense = [json.loads(line) for line in (out / "seed0" / "dense" / "metrics.jsonl").read_text().splitlines()]
    assert [m["warmup"] for m in dense] == [True, False, False]  # the shared warm-up, then the arm's updates
    warm = (out / "seed0" / "warmup-dense" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in warm] == dense[:1]  # copied, not run again
    cold = [json.loads(line) for line in (out / "seed0" / "cold-critic" / "metrics.jsonl").read_text().splitlines()]
    assert [m["warmup"] for m in cold] == [False, False]
