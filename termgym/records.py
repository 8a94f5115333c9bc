"""The trial record (DESIGN.md): one JSON object per trial, appended to a run's JSONL file.

Guarantees: every field DESIGN.md lists is present in every record, failed trials included;
``append_record`` writes one whole line per call (flushed and fsynced), so a crash loses at most the
record being written, never earlier ones.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, TypedDict, get_args

# sandbox_error: an infrastructure fault, the only kind a scheduler retries. broken_by_agent: the
# sandbox died, its shell stopped speaking the protocol or a tool broke after the agent's commands
# (reward 0). tampered: a traced step loaded a file the agent wrote outside its work, under the
# "fail" policy (reward 0).
# model_error: the agent's model could not be reached or answered unusably past its retries (no verification).
# internal_error: termgym itself failed (a bug): reward 0, kept and never retried, the traceback in logs.
ErrorKind = Literal[
    "agent_timeout",
    "verifier_timeout",
    "verifier_error",
    "sandbox_error",
    "model_error",
    "broken_by_agent",
    "tampered",
    "build_failed",
    "invalid_task",
    "cancelled",
    "internal_error",
]
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)


class TrialError(TypedDict):
    """A record's ``error``: what ended the trial abnormally, in one line."""

    kind: ErrorKind
    message: str


@dataclass
class TrialRecord:
    task: str
    backend: str
    agent: str
    resolved: bool = False
    reward: float = 0.0
    passed: int = 0
    total: int = 0
    assertions: list[dict[str, Any]] = field(default_factory=list)
    report_format: str | None = None
    turns: int = 0
    error: TrialError | None = None
    timings: dict[str, float] = field(default_factory=dict)
    run_id: str = ""
    trial_id: str = ""
    family: str = ""
    logs: dict[str, str] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # a limit not enforced or reached, a network withheld...
    system_changes: list[str] | None = None  # what the agent changed outside its work; None: not known
    model: str | None = None  # the model that drove the episode (model agents)
    stop_reason: str | None = None  # termgym.transcript.StopReason
    parse_errors: int = 0  # model replies that did not parse as an action
    usage: dict[str, int] = field(default_factory=dict)  # prompt_tokens, completion_tokens, requests (model agents)
    transcript: str | None = None  # the trial's trajectory.json, when the run keeps transcripts
    reward_scale: int = 20  # the S of the reward the trial was scored with (termgym.verifiers)
    image: dict[str, str] = field(default_factory=dict)  # ref, source ("docker_image", "build", "host"), digest
    overrides: dict[str, Any] = field(default_factory=dict)  # the run's overrides that applied: name -> value
    network: dict[str, bool] = field(default_factory=dict)  # per phase: what the task asked, what it got
    artifacts: list[str] = field(default_factory=list)  # files copied out of the sandbox, relative to the trial dir
    steps: list[dict[str, Any]] = field(default_factory=list)  # multi-step tasks: one result per [[steps]] entry
    node: str = ""  # where it ran: the Ray node (--cluster), else the scheduler's node, else ''
    kept: dict[str, str] | None = None  # --keep: the sandbox left running (backend, id, attach and remove commands)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=False)


def append_record(path: str | os.PathLike, record: TrialRecord) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    line = record.to_json() + "\n"
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every complete record in a JSONL file (a torn last line is skipped)."""
    records = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records
