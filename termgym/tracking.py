"""Experiment tracking: a run's metrics in TensorBoard or Weights & Biases (``--track``), beside
the JSONL files, which stay the record.

Neither package is a dependency of termgym: each is imported when a tracker opens (the ``track``
extra installs both, pinned), and ``require_tracker`` turns a missing one into one line before any
work starts. TensorBoard's files are written by TensorBoard's own event writer
(``tensorboard.summary.writer.event_file_writer``, the one PyTorch's ``SummaryWriter`` writes
through) as scalar summaries, which TensorBoard's reader lists under ``scalars``; no PyTorch is
needed, so ``termgym run`` tracks as the trainer does. W&B runs through its client, offline unless
``WANDB_MODE`` says otherwise: offline needs no account and no network, and ``wandb sync DIR``
uploads the run later.

Guaranteed: ``flatten`` is pure; it keeps every number of a metrics object (a boolean as 0 or 1)
under its ``/``-joined path and leaves out ``None``, strings, lists and per-task tables (a
``groups`` mapping under a ``tasks`` key: one series per task, hundreds in a training pool;
metrics.jsonl keeps them). A tracker writes each scalar given to ``log`` at that step, and the
configuration given when it opened as the run's hyperparameters (TensorBoard: a ``hyperparameters``
text table, CleanRL's habit; W&B: the run's config). ``close`` flushes everything to disk. Not
guaranteed: anything about W&B's servers, which an offline run never contacts.
"""

from __future__ import annotations

import importlib
import json
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from termgym.errors import ConfigError, UnknownName

TRACKERS = ("tensorboard", "wandb")
EXTRA = "pip install -e '.[track]'"


def require_tracker(kind: str) -> None:
    """Nothing when ``kind`` is a tracker whose package imports; else one ``ConfigError`` line."""
    if kind not in TRACKERS:
        raise UnknownName("--track", kind, TRACKERS)
    try:
        importlib.import_module(kind)  # the package is named as the tracker is
    except ImportError as exc:
        raise ConfigError(f"--track {kind} needs the {kind} package ({EXTRA}): {exc}") from None


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, float]:
    """Pure: every number in ``metrics`` (nested mappings included) as ``{"a/b/c": value}``, each
    name under ``prefix``; booleans as 0.0 or 1.0; ``None``, strings, lists and per-task tables
    left out (the module's docstring)."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        name = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            if not (key == "groups" and name.rsplit("/", 2)[-2:-1] == ["tasks"]):
                out.update(flatten(value, name))
        elif isinstance(value, (bool, int, float)):
            out[name] = float(value)
    return out


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Pure: a Markdown table (what TensorBoard's text dashboard renders); ``|`` in a cell escaped."""

    def line(cells: Sequence[Any]) -> str:
        return "| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"

    return "\n".join([line(columns), line(["---"] * len(columns)), *(line(row) for row in rows)])


def config_rows(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Pure: a configuration as (name, value) rows, values as JSON (a list as ``["a", "b"]``)."""
    return [(name, json.dumps(value, default=str)) for name, value in config.items()]


class Tracker(ABC):
    """Where a run's scalars, tables and hyperparameters go; a context manager that closes it."""

    @abstractmethod
    def log(self, scalars: Mapping[str, float], step: int) -> None:
        """Write each scalar at ``step`` (steps never decrease within a run)."""

    @abstractmethod
    def table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        """Write a table under ``name`` at ``step``."""

    @abstractmethod
    def close(self) -> None:
        """Flush everything to disk and release the writer."""

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorBoardTracker(Tracker):
    """Event files in ``log_dir`` (``tensorboard --logdir log_dir`` shows them)."""

    def __init__(self, log_dir: Path, config: Mapping[str, Any]) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        # TensorBoard's protocol buffers, imported by name: generated code, which pyright cannot see into
        self._event = importlib.import_module("tensorboard.compat.proto.event_pb2").Event
        self._summary = importlib.import_module("tensorboard.compat.proto.summary_pb2")
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir = log_dir
        self._writer = EventFileWriter(str(log_dir))
        self._text("hyperparameters", markdown_table(("name", "value"), config_rows(config)), 0)

    def _write(self, values: list, step: int) -> None:
        summary = self._summary.Summary(value=values)
        self._writer.add_event(self._event(wall_time=time.time(), step=step, summary=summary))

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self._write([self._summary.Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()], step)

    def _text(self, tag: str, text: str, step: int) -> None:
        """The text plugin's summary, as PyTorch's ``SummaryWriter.add_text`` writes it."""
        tensors = importlib.import_module("tensorboard.compat.proto.tensor_pb2")
        shapes = importlib.import_module("tensorboard.compat.proto.tensor_shape_pb2")
        text_plugin = importlib.import_module("tensorboard.plugins.text.plugin_data_pb2")
        metadata = self._summary.SummaryMetadata(
            plugin_data=self._summary.SummaryMetadata.PluginData(
                plugin_name="text", content=text_plugin.TextPluginData(version=0).SerializeToString()
            )
        )
        tensor = tensors.TensorProto(
            dtype="DT_STRING",
            string_val=[text.encode("utf-8")],
            tensor_shape=shapes.TensorShapeProto(dim=[shapes.TensorShapeProto.Dim(size=1)]),
        )
        self._write([self._summary.Summary.Value(tag=f"{tag}/text_summary", metadata=metadata, tensor=tensor)], step)

    def table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        self._text(name, markdown_table(columns, rows), step)

    def close(self) -> None:
        self._writer.close()


class WandbTracker(Tracker):
    """A W&B run under ``root/wandb/``: offline unless ``WANDB_MODE`` is set, in the project
    ``WANDB_PROJECT`` (default ``termgym``); W&B's console capture and system statistics are off
    (the run's own output and metrics are what it holds)."""

    def __init__(self, root: Path, config: Mapping[str, Any], name: str) -> None:
        import wandb
        from wandb.errors import Error as WandbError

        root.mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        try:
            self._run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or "termgym",
                name=name,
                dir=str(root),
                config=dict(config),
                mode=os.environ.get("WANDB_MODE") or "offline",  # type: ignore[arg-type]  # W&B checks the value
                settings=wandb.Settings(console="off", x_disable_stats=True, disable_git=True, save_code=False),
            )
        except (WandbError, ValueError) as exc:  # no login for an online run, a WANDB_MODE it refuses
            detail = " ".join(str(exc).split())
            raise ConfigError(
                f"--track wandb: W&B could not start the run ({detail}); WANDB_MODE=offline needs nothing"
            ) from None
        self.run_dir = Path(self._run.dir).parent  # root/wandb/<mode>-run-<time>-<id>

    def log(self, scalars: Mapping[str, float], step: int) -> None:
        self._run.log(dict(scalars), step=step)  # NaN and infinities too (W&B's JSON states them)

    def table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], step: int) -> None:
        self._run.log({name: self._wandb.Table(columns=list(columns), data=[list(r) for r in rows])}, step=step)

    def close(self) -> None:
        self._run.finish()


def open_tracker(kind: str, out_dir: Path, config: Mapping[str, Any], name: str) -> Tracker:
    """A ``kind`` tracker for the run in ``out_dir`` (TensorBoard: ``out_dir/tensorboard``; W&B:
    ``out_dir/wandb``), its hyperparameters ``config``, its name ``name``."""
    require_tracker(kind)
    if kind == "tensorboard":
        return TensorBoardTracker(out_dir / "tensorboard", config)
    return WandbTracker(out_dir, config, name)
