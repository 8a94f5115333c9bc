"""The report's data from a run's trial records and transcripts (pure: no I/O, no HTML).

Guarantees: every text that came from a record or a transcript is carried as-is (escaping is the
renderer's job) but clipped to the report's budget (``Caps``), and each clip says how many
characters it left out; every trial gets a status (``STATUSES``), a sort value per table column
(``COLUMNS``) and a lower-case search text; the charts are histograms whose bins count every value
exactly once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from termgym.cli.summary import is_scored, summarize

# resolved: the verifier passed it; failed: scored and not resolved; excluded: an infrastructure
# fault (left out of every rate, as in termgym.cli.summary).
STATUSES = ("resolved", "failed", "excluded")

# The trial table's columns: key, heading, numeric (sorted as numbers, not text).
COLUMNS: tuple[tuple[str, str, bool], ...] = (
    ("trial", "trial", False),
    ("task", "task", False),
    ("family", "family", False),
    ("agent", "agent", False),
    ("status", "status", False),
    ("reward", "reward", True),
    ("assertions", "assertions", True),
    ("turns", "turns", True),
    ("error", "error", False),
    ("seconds", "seconds", True),
)

TOTAL_CHARS = 12_000_000  # what every trial's transcript text may add up to, across the report
MIN_STEP_CHARS = 200


@dataclass(frozen=True)
class Caps:
    """How much text the report keeps: per transcript step, per trial's transcript, steps shown
    per trial, and per log (the verifier's output, the build log)."""

    step_chars: int = 4_000
    trial_chars: int = 60_000
    steps: int = 200
    log_chars: int = 20_000


def caps_for(trials: int) -> Caps:
    """The caps for a report of ``trials`` trials: each trial's transcript gets an even share of
    ``TOTAL_CHARS`` (between 2,000 and 60,000 characters), so 10,000 trials stay a file a browser
    opens; logs shrink the same way."""
    share = TOTAL_CHARS // max(1, trials)
    trial_chars = min(60_000, max(2_000, share))
    return Caps(
        step_chars=min(4_000, trial_chars),
        trial_chars=trial_chars,
        steps=200,
        log_chars=min(20_000, max(1_000, share // 3)),
    )


@dataclass(frozen=True)
class Clip:
    """A text cut to a limit: its ``head`` and ``tail`` kept, ``cut`` characters left out between."""

    head: str
    tail: str = ""
    cut: int = 0

    @property
    def text(self) -> str:
        return self.head + self.tail


def clip(text: str | None, limit: int) -> Clip:
    """``text`` whole when it fits in ``limit`` characters, else its first and last ``limit // 2``."""
    text = text or ""
    if limit < 2:
        raise ValueError(f"a clip needs a limit of at least 2 characters, got {limit}")
    if len(text) <= limit:
        return Clip(text)
    half = limit // 2
    return Clip(text[:half], text[len(text) - (limit - half) :], len(text) - limit)


@dataclass(frozen=True)
class Bin:
    """One bar of a histogram: values in ``[low, high)`` (the last bin includes ``high``)."""

    low: float
    high: float
    count: int
    label: str


def histogram(values: Sequence[float], edges: Sequence[float], labels: Sequence[str] | None = None) -> list[Bin]:
    """Counts of ``values`` per bin between consecutive ``edges`` (increasing); a value below the
    first edge counts in the first bin, one at or above the last in the last bin."""
    if len(edges) < 2 or any(b <= a for a, b in pairwise(edges)):
        raise ValueError(f"histogram edges must be at least two, increasing: {list(edges)}")
    if labels is not None and len(labels) != len(edges) - 1:
        raise ValueError(f"{len(edges) - 1} bins need as many labels, got {len(labels)}")
    counts = [0] * (len(edges) - 1)
    for value in values:
        index = next((i for i in range(len(counts)) if value < edges[i + 1]), len(counts) - 1)
        counts[index] += 1
    names = labels or [f"{edges[i]:g}–{edges[i + 1]:g}" for i in range(len(counts))]
    return [Bin(edges[i], edges[i + 1], counts[i], names[i]) for i in range(len(counts))]


def reward_bins(rewards: Sequence[float], bins: int = 10) -> list[Bin]:
    """The reward distribution: ``bins`` equal bins over [0, 1] (a reward of 1 is in the last)."""
    edges = [i / bins for i in range(bins + 1)]
    return histogram(rewards, edges, [f"{edges[i]:.1f}–{edges[i + 1]:.1f}" for i in range(bins)])


def turn_bins(turns: Sequence[int], most_bins: int = 20) -> list[Bin]:
    """The turn distribution: one bin per turn count from 0 to the largest while that makes at
    most ``most_bins`` bins, else ``most_bins`` bins of equal integer width."""
    largest = max(turns, default=0)
    width = max(1, math.ceil((largest + 1) / most_bins))
    edges = list(range(0, largest + width + 1, width))
    labels = [str(a) if width == 1 else f"{a}–{b - 1}" for a, b in pairwise(edges)]
    return histogram(turns, edges, labels)


def trial_status(record: Mapping[str, Any]) -> str:
    """One of ``STATUSES``."""
    if not is_scored(record):
        return "excluded"
    return "resolved" if record.get("resolved") else "failed"


def sort_values(record: Mapping[str, Any]) -> dict[str, str | float]:
    """The value each column of the trial table sorts by (``COLUMNS``' keys): numbers for the
    numeric columns (assertions: the fraction passed, -1 when the trial had none), text otherwise
    (status in ``STATUSES`` order, so resolved sorts first)."""
    error = record.get("error") or {}
    total = int(record.get("total") or 0)
    return {
        "trial": str(record.get("trial_id") or ""),
        "task": str(record.get("task") or ""),
        "family": str(record.get("family") or ""),
        "agent": str(record.get("agent") or ""),
        "status": f"{STATUSES.index(trial_status(record))}-{trial_status(record)}",
        "reward": float(record.get("reward") or 0.0),
        "assertions": int(record.get("passed") or 0) / total if total else -1.0,
        "turns": float(record.get("turns") or 0),
        "error": str(error.get("kind") or ""),
        "seconds": float((record.get("timings") or {}).get("total") or 0.0),
    }


def transcript_candidates(record: Mapping[str, Any], run_dir: Path, cwd: Path) -> list[Path]:
    """Where a trial's transcript may be, first choice first: the run directory's own
    ``trials/<trial_id>/trajectory.json`` (right even when the run was moved), then the record's
    ``transcript`` path (absolute, or relative to the directory the run was started from, tried
    from ``cwd`` and from the run directory's parent)."""
    found: list[Path] = []
    if record.get("trial_id"):
        found.append(run_dir / "trials" / str(record["trial_id"]) / "trajectory.json")
    named = record.get("transcript")
    if named:
        path = Path(named)
        found += [path] if path.is_absolute() else [cwd / path, run_dir.parent / path]
    return list(dict.fromkeys(found))


@dataclass(frozen=True)
class TurnView:
    """One transcript turn as the report shows it."""

    index: int
    kind: str  # "command", "submit" or "invalid"
    command: Clip | None = None
    exit_code: int | None = None
    duration: float | None = None
    timed_out: bool = False
    output: Clip | None = None
    dropped_bytes: int = 0
    reply: Clip | None = None
    reasoning: Clip | None = None
    error: str | None = None
    observation: Clip | None = None  # only when it differs from the output


@dataclass(frozen=True)
class TranscriptView:
    """A transcript cut to the caps: the first and last steps shown, ``steps_cut`` left out
    between them; ``note`` says why there is none (absent, unreadable)."""

    steps: list[TurnView] = field(default_factory=list)
    steps_cut: int = 0
    cut_after: int = 0  # steps_cut steps are left out after this many shown steps
    instruction: Clip | None = None
    stop_reason: str | None = None
    note: str | None = None


def transcript_view(transcript: Mapping[str, Any] | str | None, caps: Caps) -> TranscriptView:
    """What the report shows of ``transcript`` (a transcript dict; a string saying why it could
    not be read; None when there is none): at most ``caps.steps`` steps (fewer when the trial's
    budget cannot give the command and output of each ``MIN_STEP_CHARS``), half from the start and
    half from the end; each text of a step (command, output, reply...) clipped to an even share of
    half ``caps.trial_chars``, never more than ``caps.step_chars``; the instruction to a quarter."""
    if transcript is None:
        return TranscriptView(note="no transcript for this trial")
    if isinstance(transcript, str):
        return TranscriptView(note=transcript)
    turns = [t for t in transcript.get("turns") or [] if isinstance(t, Mapping)]
    # a step's command and its output share the step's part of the budget
    most = max(2, min(caps.steps, caps.trial_chars // (2 * MIN_STEP_CHARS)))
    cut = max(0, len(turns) - most)
    head = most - most // 2
    shown = turns if not cut else turns[:head] + turns[len(turns) - most // 2 :]
    per_step = max(MIN_STEP_CHARS, min(caps.step_chars, caps.trial_chars // max(2, 2 * len(shown))))
    return TranscriptView(
        steps=[_step(turn, per_step) for turn in shown],
        steps_cut=cut,
        cut_after=head if cut else 0,
        instruction=clip(str(transcript.get("instruction") or ""), max(MIN_STEP_CHARS, caps.trial_chars // 4)),
        stop_reason=transcript.get("stop_reason"),
    )


def _step(turn: Mapping[str, Any], limit: int) -> TurnView:
    action = turn.get("action") or {}
    result = turn.get("result") or None
    reply = turn.get("reply") or None
    output = str(result.get("output") or "") if result else ""
    observation = turn.get("observation")
    return TurnView(
        index=int(turn.get("index") or 0),
        kind=str(action.get("kind") or "?"),
        command=clip(str(action["command"]), limit) if action.get("command") is not None else None,
        exit_code=result.get("exit_code") if result else None,
        duration=result.get("duration") if result else None,
        timed_out=bool(result.get("timed_out")) if result else False,
        output=clip(output, limit) if result else None,
        dropped_bytes=int(result.get("dropped_bytes") or 0) if result else 0,
        reply=clip(str(reply.get("content") or ""), limit) if reply and reply.get("content") else None,
        reasoning=clip(str(reply.get("reasoning") or ""), limit) if reply and reply.get("reasoning") else None,
        error=str(action["error"]) if action.get("error") else None,
        observation=clip(str(observation), limit) if observation and str(observation) != output else None,
    )


@dataclass(frozen=True)
class TrialView:
    """One trial: its record's fields the report shows, its status, sort values, search text,
    clipped logs and its transcript."""

    index: int
    record: Mapping[str, Any]
    status: str
    sort: dict[str, str | float]
    search: str
    logs: dict[str, Clip]
    transcript: TranscriptView


def trial_view(
    index: int, record: Mapping[str, Any], transcript: Mapping[str, Any] | str | None, caps: Caps
) -> TrialView:
    """The report's view of the ``index``-th trial (``transcript`` as in ``transcript_view``)."""
    error = record.get("error") or {}
    words = [record.get(k) for k in ("trial_id", "task", "family", "agent", "model")]
    words += [trial_status(record), error.get("kind"), error.get("message")]
    return TrialView(
        index=index,
        record=record,
        status=trial_status(record),
        sort=sort_values(record),
        search=" ".join(str(w) for w in words if w).lower(),
        logs={name: clip(str(text), caps.log_chars) for name, text in (record.get("logs") or {}).items() if text},
        transcript=transcript_view(transcript, caps),
    )


@dataclass(frozen=True)
class ReportData:
    """Everything the HTML shows: the run's name, the summary (``termgym.cli.summary.summarize``),
    the trials in record order, the two histograms, the largest k of pass@k, what the run used."""

    title: str
    summary: dict[str, Any]
    trials: list[TrialView]
    rewards: list[Bin]
    turns: list[Bin]
    k: int
    run_ids: list[str]
    agents: list[str]
    backends: list[str]


def report_data(title: str, records: Sequence[Mapping[str, Any]], trials: list[TrialView]) -> ReportData:
    """The report of ``records`` (the run's trial records) and their ``trials`` views. The
    histograms count scored trials only, as the summary's rates do."""
    summary = summarize(records)
    scored = [r for r in records if is_scored(r)]
    return ReportData(
        title=title,
        summary=summary,
        trials=trials,
        rewards=reward_bins([float(r.get("reward") or 0.0) for r in scored]),
        turns=turn_bins([int(r.get("turns") or 0) for r in scored]),
        k=max((int(k) for k in summary.get("pass_at_k") or {}), default=0),
        run_ids=_distinct(records, "run_id"),
        agents=_distinct(records, "agent"),
        backends=_distinct(records, "backend"),
    )


def _distinct(records: Sequence[Mapping[str, Any]], key: str) -> list[str]:
    return list(dict.fromkeys(str(r[key]) for r in records if r.get(key)))
