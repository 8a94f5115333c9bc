"""``termgym export atif RUN --out DIR``: one ATIF trajectory file per trial of a run
(``termgym.atif`` maps them).

What a run directory may hold, each exported when found:

* ``trials.jsonl`` and ``trials/<trial id>/trajectory.json`` (``termgym run``): the record and the
  transcript of each trial; a transcript without a record (``termgym check``'s ``runs/check-*``)
  is exported alone, a record without a transcript is skipped and counted;
* a training run's ``sft/demonstrations.jsonl`` (with ``sft/records.jsonl``), the same under
  ``first/``, and ``ppo/trajectories.jsonl`` (or ``trajectories.jsonl`` in a PPO run's own
  directory): token ids without text, the tokenizer's fingerprint beside them.

``RUN`` may also be one trial directory or one ``trajectory.json``. Files are named by trial id
(``<trial id>.json``), or by where they came from in a training run; an existing file is replaced.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from termgym import atif
from termgym.cli import common
from termgym.cli.common import UsageError
from termgym.records import read_records
from termgym.transcript import FILENAME, SCHEMA


@dataclass
class Exported:
    written: list[Path] = field(default_factory=list)
    sources: Counter = field(default_factory=Counter)  # what each file came from
    skipped: list[str] = field(default_factory=list)  # one line per trial that could not be exported


def export_atif(run: Path, out: Path) -> Exported:
    """Every trial ``run`` holds as ATIF files in ``out`` (module docstring)."""
    if not run.exists():
        raise UsageError(f"{run}: no such run directory or transcript")
    result = Exported()
    out.mkdir(parents=True, exist_ok=True)
    if run.is_file() or (run / FILENAME).is_file():
        transcript = _transcript(run if run.is_file() else run / FILENAME)
        _write(result, out, transcript.get("trial_id") or run.stem, atif.from_transcript(transcript), "transcript")
        return result
    _export_trials(run, out, result)
    fingerprint = _fingerprint(run)
    index = _instructions(run)
    for base in (run, run / "first"):
        _export_demonstrations(base / "sft", out, result, fingerprint, index)
    for trajectories in (run / "ppo" / "trajectories.jsonl", run / "trajectories.jsonl"):
        if trajectories.is_file():
            _export_rollouts(trajectories, out, result, fingerprint, index)
    if not result.written and not result.skipped:
        raise UsageError(f"{run}: no trials found (no trials.jsonl, trials/, sft/ or trajectories.jsonl)")
    return result


def _transcript(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a transcript ({exc})") from exc
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UsageError(f"{path}: not a termgym transcript (schema {SCHEMA})")
    return data


def _export_trials(run: Path, out: Path, result: Exported) -> None:
    records = read_records(run / "trials.jsonl") if (run / "trials.jsonl").is_file() else []
    seen: set[Path] = set()
    for record in records:
        path = run / "trials" / str(record.get("trial_id", "")) / FILENAME
        if not path.is_file() and record.get("transcript"):
            path = Path(record["transcript"])
        if not path.is_file():
            result.skipped.append(f"{record.get('trial_id') or record.get('task')}: no transcript kept")
            continue
        seen.add(path.resolve())
        transcript = _transcript(path)
        _write(result, out, str(record.get("trial_id")), atif.from_transcript(transcript, record), "trial")
    for path in sorted((run / "trials").glob(f"*/{FILENAME}")):
        if path.resolve() not in seen:
            transcript = _transcript(path)
            _write(result, out, path.parent.name, atif.from_transcript(transcript), "transcript")


def _export_demonstrations(
    sft: Path, out: Path, result: Exported, fingerprint: str | None, index: dict[str, str]
) -> None:
    path = sft / "demonstrations.jsonl"
    if not path.is_file():
        return
    records = (
        {r.get("task"): r for r in read_records(sft / "records.jsonl")} if (sft / "records.jsonl").is_file() else {}
    )
    stage = "first-" if sft.parent.name == "first" else ""
    for number, demo in enumerate(read_records(path)):
        task = str(demo.get("task", ""))
        data = atif.from_token_samples(
            task,
            _instruction(index, task),
            [{"ids": demo.get("ids") or [], "mask": demo.get("mask") or []}],
            commands=demo.get("commands") or [],
            record=records.get(task),
            tokenizer=fingerprint,
            kind="demonstration",
        )
        _write(result, out, f"{stage}demonstration-{number:05d}", data, "demonstration")


def _export_rollouts(path: Path, out: Path, result: Exported, fingerprint: str | None, index: dict[str, str]) -> None:
    for number, trajectory in enumerate(read_records(path)):
        task = str(trajectory.get("task", ""))
        samples = [
            {
                "ids": s.get("ids") or [],
                "mask": s.get("loss_mask") or [],
                "logprobs": s.get("logprobs"),
                "reason": s.get("reason"),
            }
            for s in trajectory.get("samples") or []
        ]
        kept = (
            "step",
            "policy_version",
            "stop_reason",
            "reward",
            "replies",
            "parse_errors",
            "bridges",
            "bridge_breaks",
            "summaries",
            "commands",
        )
        data = atif.from_token_samples(
            task,
            _instruction(index, task),
            samples,
            record={"stop_reason": trajectory.get("stop_reason"), "reward": trajectory.get("reward", 0.0)},
            tokenizer=fingerprint,
            kind="rollout",
            extra={"rollout": {k: trajectory.get(k) for k in kept}},
        )
        _write(result, out, f"rollout-step{int(trajectory.get('step', 0)):04d}-{number:05d}", data, "rollout")


def _fingerprint(run: Path) -> str | None:
    """The tokenizer of a training run's ids: its initial policy's (every phase shares it)."""
    for model_dir in (
        run / "init",
        run / "policy",
        run / "sft" / "policy",
        run / "ppo" / "policy",
        run.parent / "init",
    ):
        found = atif.tokenizer_fingerprint(model_dir)
        if found is not None:
            return found
    return None


def _instructions(run: Path) -> dict[str, str]:
    """A training run's generated tasks by directory name: their instruction files."""
    return {p.parent.name: str(p) for p in sorted(run.glob("**/tasks/*/*/instruction.md"))}


def _instruction(index: dict[str, str], task: str) -> str:
    path = index.get(task.rsplit("/", 1)[-1])
    return Path(path).read_text(encoding="utf-8") if path else ""


def _write(result: Exported, out: Path, name: str, data: dict[str, Any], source: str) -> None:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "trial"
    target = out / f"{safe}.json"
    target.write_text(json.dumps(data, ensure_ascii=False, indent=1), encoding="utf-8")
    result.written.append(target)
    result.sources[source] += 1


async def cmd_export(args: argparse.Namespace) -> int:
    result = export_atif(args.run, args.out)
    parts = ", ".join(f"{n} from {kind}s" for kind, n in sorted(result.sources.items()))
    common.out.print(
        f"wrote {len(result.written)} ATIF trajectories to {args.out}" + (f" ({parts})" if parts else ""), markup=False
    )
    for line in result.skipped:
        common.err.print(f"skipped {line}", markup=False)
    return 0
