"""``termgym.tracking``: the pure flattening and tables, a tracker's refusal without its package, and
``termgym run --track`` read back with TensorBoard's and W&B's own readers (a simulated run)."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from termgym.cli import main as termgym_main
from termgym.errors import ConfigError
from termgym.records import read_records
from termgym.tracking import config_rows, flatten, markdown_table, require_tracker
from tests.helpers import REPO_ROOT


def test_flatten_keeps_every_number_under_its_path_and_leaves_out_the_rest():
    metrics = {
        "step": 0,
        "mode": "wait",  # a string
        "ok": True,
        "gone": None,
        "versions": [1, 2],  # a list
        "families": {"tv_distance": 0.5, "groups": {"a": {"kept": 3}}, "totals": {"kept": 3}},
        "tasks": {"tv_distance": 0.25, "groups": {"a/t1": {"kept": 1}}},  # per task: left out
        "run": {"tasks": {"groups": {"a/t1": {"kept": 1}}, "mean_turns_kept": 1.5}},
    }
    assert flatten(metrics, "scheduler") == {
        "scheduler/step": 0.0,
        "scheduler/ok": 1.0,
        "scheduler/families/tv_distance": 0.5,
        "scheduler/families/groups/a/kept": 3.0,  # per family: kept
        "scheduler/families/totals/kept": 3.0,
        "scheduler/tasks/tv_distance": 0.25,
        "scheduler/run/tasks/mean_turns_kept": 1.5,
    }
    assert flatten({"x": {"y": 1}}) == {"x/y": 1.0}


def test_tables_are_markdown_with_their_cells_escaped_and_a_config_as_json_values():
    assert markdown_table(["a", "b"], [["x|y", 1], ["two\nlines", 0.5]]) == (
        "| a | b |\n| --- | --- |\n| x\\|y | 1 |\n| two lines | 0.5 |"
    )
    assert config_rows({"tasks": ["a", "b"], "out": "run", "n": 2}) == [
        ("tasks", '["a", "b"]'),
        ("out", '"run"'),
        ("n", "2"),
    ]


def test_an_unknown_tracker_or_a_missing_package_is_one_clear_line(monkeypatch):
    with pytest.raises(ConfigError, match=r"--track 'tensorbaord': did you mean tensorboard\?"):
        require_tracker("tensorbaord")
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # as if the track extra were not installed
    with pytest.raises(ConfigError, match=r"--track tensorboard needs the tensorboard package \(pip install"):
        require_tracker("tensorboard")


def test_a_wandb_run_that_cannot_start_is_one_line(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the track extra")
    from termgym.tracking import open_tracker

    monkeypatch.setenv("WANDB_MODE", "sideways")  # W&B refuses the mode: no network is tried
    with pytest.raises(ConfigError, match=r"--track wandb: W&B could not start the run \(.*sideways") as caught:
        open_tracker("wandb", tmp_path, {}, "run")
    assert "\n" not in str(caught.value)


def test_run_refuses_a_tracker_it_cannot_open_before_any_work(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)
    out = tmp_path / "run"
    assert termgym_main(["run", "envs/", "--simulate", "--out", str(out), "--track", "wandb"]) == 2
    err = capsys.readouterr().err
    assert "--track wandb needs the wandb package" in err and err.count("\n") == 1
    assert not out.exists()


def simulated_run(out, tracker: str) -> None:
    args = ["run", str(REPO_ROOT / "envs"), "--simulate", "--batch", "16", "--steps", "2", "--mode", "cancel"]
    assert termgym_main([*args, "--out", str(out), "--track", tracker]) == 0


def expected(out: Path) -> dict[int, dict[str, float]]:
    """What the run's files hold, as the tracker's names: every step's accounting, then the summary."""
    steps = read_records(out / "metrics.jsonl")
    by_step = {m["step"] + 1: flatten(m, "scheduler") for m in steps}
    by_step[len(steps)].update(flatten(json.loads((out / "summary.json").read_text()), "summary"))
    return by_step


def test_run_tracks_each_steps_accounting_and_the_summary_in_tensorboard(tmp_path):
    pytest.importorskip("tensorboard", reason="the track extra")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    simulated_run(out, "tensorboard")
    reader = EventAccumulator(str(out / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    reader.Reload()
    tracked: dict[int, dict[str, float]] = {}
    for tag in reader.Tags()["scalars"]:
        for event in reader.Scalars(tag):
            tracked.setdefault(event.step, {})[tag] = event.value
    wanted = expected(out)
    assert sorted(tracked) == [1, 2] and {step: set(v) for step, v in tracked.items()} == {
        step: set(v) for step, v in wanted.items()
    }
    for step, values in wanted.items():
        assert tracked[step] == pytest.approx(values, rel=1e-6)
    assert "summary/resolved_rate" in tracked[2] and "scheduler/families/tv_distance" in tracked[1]
    table = reader.Tensors("summary/families/text_summary")[0].tensor_proto.string_val[0].decode()
    assert table.startswith("| family | trials | resolved | reward |") and "| file-ops |" in table
    flags = reader.Tensors("hyperparameters/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "| steps | 2 |" in flags and '| mode | "cancel" |' in flags


def wandb_run(out: Path) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """The offline W&B run in ``out/wandb``, read with W&B's own reader: its history by step (each
    row's items by name, JSON-decoded) and its config."""
    from wandb.sdk.internal.datastore import DataStore

    records = importlib.import_module("wandb.proto.wandb_internal_pb2")  # generated: no types to check
    (log,) = (out / "wandb").glob("offline-run-*/run-*.wandb")
    store = DataStore()
    store.open_for_scan(str(log))
    history: dict[int, dict[str, Any]] = {}
    config: dict[str, Any] = {}
    try:
        while (data := store.scan_data()) is not None:
            record = records.Record()
            record.ParseFromString(data)
            if record.WhichOneof("record_type") == "history":
                row = history.setdefault(record.history.step.num, {})
                row.update({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
            elif record.WhichOneof("record_type") == "run":
                config = {item.key: json.loads(item.value_json) for item in record.run.config.update}
    finally:
        store._fp.close()  # type: ignore[union-attr]  # DataStore has no close of its own for a scan
    return history, config


def test_run_tracks_the_same_in_an_offline_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="the track extra")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # offline by default: no network, no account
    monkeypatch.setenv("WANDB_SILENT", "true")
    out = tmp_path / "run"
    simulated_run(out, "wandb")
    history, config = wandb_run(out)
    assert config["steps"] == 2 and config["mode"] == "cancel"  # the run's flags
    for step, values in expected(out).items():
        assert {k: v for k, v in history[step].items() if k in values} == pytest.approx(values)
        assert set(values) <= set(history[step])
    assert history[2]["summary/families/_type"] == "table-file"  # the per-family table, as a W&B table
