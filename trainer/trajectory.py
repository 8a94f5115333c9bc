"""What a rollout produces and the trainer consumes: ``Sample`` (one segment of an episode, token
by token) and ``Trajectory`` (one episode: its samples, outcome and counts).

Data only, below every module that makes or reads them (the rollout makes them, ``batch.py`` turns
them into tensors, the samplers never see them), so no import of the trainer goes in a circle.
The guarantees about what a sample holds are the rollout's (``trainer/rollout.py``); here,
``token_drift`` counts where they fail.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import torch

from termgym.records import TrialRecord


@dataclass
class Sample:
    """One segment of an episode as the trainer trains it. Per-token lists are aligned with ``ids``."""

    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each turn's sampled ids
    sampled: list[list[int]] = field(default_factory=list)  # each turn's ids as the sampler returned them
    segment: int = 0
    reason: str = "start"  # why the segment began: start, bridge_break, truncate, summary
    routing: torch.Tensor | None = None  # [len(ids), MoE layers, top_k] int16, -1 where not recorded

    def to_dict(self) -> dict:
        """JSON-ready; ``routing`` is null, or one entry per id: null where not recorded, else
        ``[layers][top_k]`` expert ids."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "routing"}
        out["routing"] = None
        if self.routing is not None:
            recorded = (self.routing >= 0).flatten(1).all(1).tolist()
            out["routing"] = [row if kept else None for row, kept in zip(self.routing.tolist(), recorded)]
        return out


@dataclass
class Trajectory:
    """One episode: its samples (one per segment), its outcome and what the loop counted.
    ``prompt_tokens`` is the length of the episode's opening as rendered (the first segment's ids
    before its first sampled id; all of them when nothing was sampled)."""

    task: str
    samples: list[Sample] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    policy_version: int = 0
    launch: int = 0  # launch order within the step (a deterministic batch order)
    stop_reason: str | None = None
    replies: int = 0
    parse_errors: int = 0
    bridges: int = 0
    bridge_breaks: int = 0
    summaries: int = 0
    summaries_failed: int = 0
    prompt_tokens: int = 0
    reward: float = 0.0
    record: TrialRecord | None = None

    @property
    def context_exhausted(self) -> bool:
        return self.stop_reason == "context_exhausted"

    def to_json(self) -> str:
        """One JSON object (the record is written to records.jsonl on its own)."""
        out = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("samples", "record")}
        return json.dumps({**out, "samples": [s.to_dict() for s in self.samples]})


def token_drift(trajectory: Trajectory) -> int:
    """Positions of the loss region whose training id differs from the id the sampler returned
    (a position past the end of ``ids`` counts as different). Exactly 0 under TITO."""
    drift = 0
    for sample in trajectory.samples:
        for (start, _), sampled in zip(sample.turns, sample.sampled):
            for offset, token in enumerate(sampled):
                position = start + offset
                drift += position >= len(sample.ids) or sample.ids[position] != token
    return drift
