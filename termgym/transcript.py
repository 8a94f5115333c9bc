"""An episode's transcript: what the agent was told, what it replied, what ran, what came back.

Every trial writes one to ``RUN/trials/<trial_id>/trajectory.json`` (``write_transcript``); the
trial record points to it. The schema is versioned (``SCHEMA``). The environment records every
step itself, so every agent (the oracle, a scripted agent, a person in ``termgym shell``) leaves
one; a model agent adds its replies, messages, token samples and usage; an agent harness behind the
recording gateway adds ``harness`` and ``calls`` (``termgym.gateway.calls.Call``). One ``turns``
entry per agent turn, in order: ``index``, ``reply`` (null for agents without a model), ``action``,
``result`` (null when nothing ran), ``observation``, ``segment``. Token ids and log-probs appear
only where the model's server returned them.

Every field: docs/guides/agents.md#the-transcript-trajectoryjson-schema-termgymtranscript1."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

SCHEMA = "termgym.transcript/1"
FILENAME = "trajectory.json"

# Why an episode ended. submitted: the agent submitted (terminated). max_turns, agent_timeout,
# context_exhausted (the next turn cannot fit the model's context window), parse_errors (too many
# replies in a row that did not parse): truncated, then verified. model_error: the model could not
# be reached (no verification). sandbox_error: the sandbox failed (the infrastructure);
# broken_by_agent: the agent's commands broke it (as the record's error kind says). cancelled: the trial was stopped.
# internal_error: termgym itself failed (a bug; the record carries the traceback). harness_exit: an
# agent harness (termgym.integrations) ended its loop without submitting, for a reason of its own (verified).
StopReason = Literal[
    "submitted",
    "max_turns",
    "agent_timeout",
    "context_exhausted",
    "parse_errors",
    "model_error",
    "sandbox_error",
    "broken_by_agent",
    "cancelled",
    "internal_error",
    "harness_exit",
]


@dataclass
class Usage:
    """Tokens a model spent: prompt and completion, summed over the episode's requests."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    requests: int = 0

    def add(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens += prompt_tokens
        self.completion_tokens += completion_tokens
        self.requests += 1


@dataclass
class Segment:
    """One token sample of an episode: the conversation from its start or from a rewrite of the
    history (a summary, elided observations). ``ids`` is the whole sequence the model saw and
    produced in this segment, ``mask`` 1 where the model sampled the id, ``logprobs`` the server's
    log-prob of each sampled id (0.0 elsewhere); empty when the client works in messages only."""

    index: int
    reason: str  # "start", "summary" or "truncate"
    messages: list[dict[str, Any]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    bridges: int = 0
    bridge_breaks: int = 0


@dataclass
class Transcript:
    task: str = ""
    agent: str = ""
    model: str | None = None
    instruction: str = ""
    trial_id: str = ""
    turns: list[dict[str, Any]] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    stop_reason: StopReason | None = None
    parse_errors: int = 0
    summaries: int = 0
    summaries_failed: int = 0
    usage: Usage = field(default_factory=Usage)
    notes: list[str] = field(default_factory=list)  # what the client learned (a field the server rejects...)
    # an agent harness's episode (termgym.integrations): its own account, and every gateway call
    harness: dict[str, Any] | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    _pending_reply: dict[str, Any] | None = field(default=None, repr=False)

    # -- what the agent adds -------------------------------------------------------------------

    def reply(self, reply: dict[str, Any]) -> None:
        """The model's reply that the next step (or ``invalid``) acts on."""
        self._pending_reply = reply

    def invalid(self, error: str, observation: str) -> None:
        """A reply that did not parse: nothing ran; the model is shown ``observation``."""
        self.parse_errors += 1
        self._append({"kind": "invalid", "error": error}, result=None, observation=observation)

    def observed(self, observation: str) -> None:
        """What the agent showed the model after the last turn (the formatted observation)."""
        if self.turns:
            self.turns[-1]["observation"] = observation

    # -- what the environment adds -------------------------------------------------------------

    def step(self, command: str, timeout: float | None, result: dict[str, Any], observation: str) -> None:
        action: dict[str, Any] = {"kind": "command", "command": command}
        if timeout is not None:
            action["timeout"] = timeout
        self._append(action, result=result, observation=observation)

    def submit(self) -> None:
        self._append({"kind": "submit"}, result=None, observation=None)

    def stop(self, reason: StopReason) -> None:
        """The first stop reason set wins: later ones are consequences of it."""
        if self.stop_reason is None:
            self.stop_reason = reason

    @property
    def segment(self) -> Segment:
        if not self.segments:
            self.segments.append(Segment(0, "start"))
        return self.segments[-1]

    def new_segment(self, reason: str) -> Segment:
        self.segments.append(Segment(len(self.segments), reason))
        return self.segments[-1]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("_pending_reply")
        return {"schema": SCHEMA, **data}

    def _append(self, action: dict[str, Any], *, result: dict[str, Any] | None, observation: str | None) -> None:
        reply, self._pending_reply = self._pending_reply, None
        self.turns.append(
            {
                "index": len(self.turns),
                "reply": reply,
                "action": action,
                "result": result,
                "observation": observation,
                "segment": self.segments[-1].index if self.segments else 0,
            }
        )


def write_transcript(directory: str | os.PathLike, transcript: Transcript) -> Path:
    """``directory/trajectory.json``, written whole (to a temporary name, then renamed)."""
    target = Path(directory) / FILENAME
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = target.with_suffix(".json.tmp")
    scratch.write_text(json.dumps(transcript.to_dict(), ensure_ascii=False), encoding="utf-8")
    os.replace(scratch, target)
    return target


def read_transcript(path: str | os.PathLike) -> dict[str, Any]:
    """A transcript file (or a trial directory holding one), checked for its schema."""
    target = Path(path)
    if target.is_dir():
        target = target / FILENAME
    data = json.loads(target.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise ValueError(f"{target}: not a termgym transcript (schema {SCHEMA})")
    return data
