"""``termgym train --track``: a short PPO run read back with TensorBoard's own reader and W&B's own
offline-run reader, every per-step metric of metrics.jsonl found at its step; the held-out table's
scalars; the names (pure)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from termgym.cli import main as termgym_main
from termgym.tracking import flatten
from termgym.trainer.evaluate import EvalSummary
from termgym.trainer.tracking import SECTIONS, heldout_scalars, heldout_table, step_scalars
from tests.termgym.test_tracking import wandb_run
from tests.trainer.test_ppo import metrics_of, tiny_args

pytest.importorskip("tensorboard", reason="the track extra: pip install -e '.[track]'")


def expected_tag(path: str, tags: set[str]) -> str:
    """The one tracked tag for a metrics.jsonl path: the path itself (nested metrics) or the path
    under a section (a top-level one)."""
    found = [t for t in tags if t == path or t.split("/", 1)[1] == path]
    assert len(found) == 1, (path, found)
    return found[0]


def tracked_paths(m: dict) -> dict[str, float]:
    """Every number a metrics.jsonl object holds, by path: what a tracker must have for the step."""
    return {path: value for path, value in flatten(m).items() if path != "step"}


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-7)  # float32 in events


@pytest.mark.slow
def test_a_tracked_run_leaves_every_per_step_metric_for_tensorboards_reader(tmp_path, tiny_policy_dir, no_leaks):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert termgym_main(["train", *tiny_args(out, tiny_policy_dir, 2), "--track", "tensorboard"]) == 0
    metrics = metrics_of(out)
    reader = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    reader.Reload()
    tags = set(reader.Tags()["scalars"])
    for name in ("charts/reward", "charts/resolved", "losses/explained_variance", "losses/value_loss"):
        assert name in tags
    assert {"losses/clip_fraction", "losses/approx_kl", "losses/policy_loss"} <= tags  # the second step's
    assert {"consistency/token_drift", "timings/rollout_seconds", "scheduler/families/tv_distance"} <= tags
    checked = 0
    for m in metrics:
        for path, value in tracked_paths(m).items():
            events = {e.step: e.value for e in reader.Scalars(expected_tag(path, tags))}
            assert same(events[m["step"] + 1], value), (path, events, value)
            checked += 1
    assert checked > 100  # the step's metrics and the scheduler's accounting per family
    # nothing tracked that metrics.jsonl lacks, and None (the warm-up's policy loss) is no point
    assert len(tags) == len({expected_tag(p, tags) for m in metrics for p in tracked_paths(m)})
    assert [e.step for e in reader.Scalars("losses/policy_loss")] == [2]
    # the configuration as the run's hyperparameters (CleanRL's text table)
    text = reader.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| steps | 2 |" in text and '| tasks | ["archives/extract-configs"' in text and "| track | " in text


@pytest.mark.slow
def test_a_tracked_run_is_an_offline_wandb_run_that_wandbs_reader_opens(
    tmp_path, tiny_policy_dir, no_leaks, monkeypatch
):
    pytest.importorskip("wandb", reason="the track extra")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline by default: no network, no account
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    assert termgym_main(["train", *tiny_args(out, tiny_policy_dir, 2), "--track", "wandb"]) == 0
    history, config = wandb_run(out)
    assert config["steps"] == 2 and config["track"] == "wandb" and config["tasks"][0] == "archives/extract-configs"
    metrics = metrics_of(out)
    assert sorted(history) == [m["step"] + 1 for m in metrics]
    for m in metrics:
        row = history[m["step"] + 1]
        assert len([key for key in row if not key.startswith("_")]) == len(tracked_paths(m))  # and nothing else
        for path, value in tracked_paths(m).items():
            logged = row[expected_tag(path, {key for key in row if not key.startswith("_")})]  # W&B's own: _step...
            assert same(float(logged), value), (path, logged, value)


def test_step_scalars_put_each_metric_under_its_section_and_nested_ones_under_their_path():
    m = {
        "step": 3,
        "reward": 0.25,
        "explained_variance": float("nan"),
        "policy_loss": None,
        "warmup": True,
        "policy_versions": [3],
        "something_new": 7,
        "scheduler": {"mode": "wait", "families": {"tv_distance": 0.1, "groups": {"a": {"kept": 2}}}},
    }
    scalars = step_scalars(m)
    assert math.isnan(scalars.pop("losses/explained_variance"))
    assert scalars == {
        "charts/reward": 0.25,
        "charts/warmup": 1.0,
        "train/something_new": 7.0,  # a metric no section names is tracked all the same
        "scheduler/families/tv_distance": 0.1,
        "scheduler/families/groups/a/kept": 2.0,
    }
    assert {SECTIONS[k] for k in ("approx_kl", "clip_fraction", "entropy", "value_loss")} == {"losses"}
    assert SECTIONS["token_drift"] == "consistency" and SECTIONS["update_seconds"] == "timings"


def summary(resolved: float, families: dict[str, dict[str, float]]) -> EvalSummary:
    return EvalSummary(tasks=4, resolved=resolved, passed=2.0, reward=0.1, errors=0, families=families)


def test_the_heldout_results_per_family_as_scalars_and_a_table():
    before = summary(
        0.25,
        {
            "copy-file": {"tasks": 2, "resolved": 0.5, "passed": 3},
            "two-files": {"tasks": 2, "resolved": 0.0, "passed": 1},
        },
    )
    after = summary(0.5, {"copy-file": {"tasks": 2, "resolved": 1.0, "passed": 4}})
    scalars = heldout_scalars({"sft": before, "ppo": after})
    assert scalars["heldout/sft/resolved"] == 0.25 and scalars["heldout/ppo/resolved"] == 0.5
    assert scalars["heldout/sft/families/two-files/resolved"] == 0.0
    assert scalars["heldout/ppo/families/copy-file/resolved"] == 1.0 and scalars["heldout/ppo/passed"] == 2.0
    columns, rows = heldout_table({"sft": before, "ppo": after})
    assert columns == ["family", "tasks", "sft: resolved", "ppo: resolved"]
    assert rows[0] == ["copy-file", 2, 0.5, 1.0]
    assert rows[1][:3] == ["two-files", 2, 0.0] and math.isnan(rows[1][3])  # after PPO lacks the family


def test_tracking_without_its_package_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if the track extra were not installed
    assert termgym_main(["train", "--out", str(tmp_path / "run"), "--track", "wandb"]) == 2
    err = capsys.readouterr().err
    assert "--track wandb needs the wandb package (pip install -e '.[track]')" in err and err.count("\n") == 1
    assert not (tmp_path / "run").exists()
    assert termgym_main(["train", "--out", str(tmp_path / "run"), "--track", "tensorbord"]) == 2
    assert "--track 'tensorbord': did you mean tensorboard?" in capsys.readouterr().err


def test_the_pipeline_logs_its_heldout_table_to_its_own_tracker(tmp_path):
    """What the pipeline hands its tracker at the end, read back from the event file."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from termgym.tracking import open_tracker
    from termgym.trainer.tracking import job_scalars, log_heldout, log_job

    evaluations = {"sft": summary(0.25, {"copy-file": {"tasks": 4, "resolved": 0.25, "passed": 3}})}
    job = {"run": "runs/x", "pool": 10, "heldout": {"sft": {"resolved": 0.25}}, "timings": {"ppo": 12.5}}
    with open_tracker("tensorboard", tmp_path, {"pool": 10}, name="run") as tracker:
        log_heldout(tracker, evaluations, 5)
        log_job(tracker, job, [2.0, 1.5, 0.75], 5)
    log_heldout(None, evaluations, 5)  # no tracker: nothing to do
    log_job(None, job, [], 5)
    assert job_scalars(job, []) == {"job/pool": 10.0, "job/timings/ppo": 12.5}  # held-out results apart
    reader = EventAccumulator(str(tmp_path / "tensorboard"))
    reader.Reload()
    assert [(e.step, e.value) for e in reader.Scalars("heldout/sft/families/copy-file/resolved")] == [(5, 0.25)]
    table = reader.Tensors("heldout/families/text_summary")[0].tensor_proto.string_val[0].decode()
    assert table.splitlines()[0] == "| family | tasks | sft: resolved |" and "| copy-file | 4 | 0.25 |" in table
    sft_loss = {tag: reader.Scalars(tag)[0].value for tag in reader.Tags()["scalars"] if tag.startswith("job/sft")}
    assert sft_loss == {"job/sft_loss/first": 2.0, "job/sft_loss/last": 0.75, "job/sft_loss/steps": 3.0}
    assert [(e.step, e.value) for e in reader.Scalars("job/timings/ppo")] == [(5, 12.5)]


async def test_the_pipeline_is_one_tracked_run_its_ppo_phase_included(tmp_path, monkeypatch):
    """run_pipeline opens one tracker in the job's directory and hands it to PPO (reinforce, then
    train), which logs into it rather than opening its own; the tracker is closed at the end."""
    from dataclasses import replace

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from termgym.trainer import pipeline
    from termgym.trainer.config import PRESETS, Config

    given = {}

    async def train(cfg, tracker=None):
        given.update(pool=cfg.pool, out=cfg.out, tracker=tracker)
        assert tracker is not None  # the job's, handed down
        tracker.log({"charts/reward": 0.5}, 1)
        return []

    async def phases(cfg, console, tracker):
        await pipeline.reinforce(cfg, tmp_path / "model", [], Path(cfg.out) / "ppo", tracker)
        pipeline.log_heldout(tracker, {"ppo": summary(0.75, {})}, 1)
        return {}

    monkeypatch.setattr(pipeline, "train", train)
    monkeypatch.setattr(pipeline, "_run_phases", phases)
    run = tmp_path / "job"
    await pipeline.run_pipeline(replace(Config(**PRESETS["tiny"]), out=str(run), track="tensorboard"))
    assert given["pool"] == 0 and given["out"] == str(run / "ppo") and given["tracker"] is not None
    assert not (run / "ppo" / "tensorboard").exists()  # PPO logged into the job's run, opened no other
    reader = EventAccumulator(str(run / "tensorboard"))
    reader.Reload()
    assert [(e.step, e.value) for e in reader.Scalars("charts/reward")] == [(1, 0.5)]
    assert [e.value for e in reader.Scalars("heldout/ppo/resolved")] == [0.75]
    text = reader.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| pool | 1200 |" in text and '| families | "explore" |' in text  # the job's configuration
