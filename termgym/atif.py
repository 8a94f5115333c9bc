"""termgym's trials as ATIF trajectories (the Agent Trajectory Interchange Format, Harbor's RFC 0001,
written as ``ATIF-v1.7``), and trajectories read back, each checked against the format's structural
rules (``termgym.atif_rules``).

The instruction is the first step; each agent turn is one ``agent`` step (reply, the command as a
tool call, the output as the observation, token ids and log-probs where the trial has them);
agents without a model have steps with ``llm_call_count: 0``; a harness behind the recording
gateway has one agent step per model call (``_harness_steps``); a context rewrite is a ``system``
step; the verifier's result is in ``final_metrics.extra`` and the rest under ``extra.termgym``. A
training run's files (token ids, no text) become trajectories whose agent steps hold the ids, with
the tokenizer's fingerprint (``tokenizer_fingerprint``).

Pure functions over the stored JSON (no import of the trainer; the files are read as data).
What maps and what does not, field by field: docs/guides/atif.md#how-a-trial-maps."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from termgym.atif_rules import check

SCHEMA_VERSION = "ATIF-v1.7"
VERIFIER_FIELDS = ("reward", "resolved", "passed", "total", "assertions", "report_format", "reward_scale", "error")
CONTEXT_REWRITES = {  # a transcript segment's reason -> the RFC's context_management
    "summary": {"type": "compaction", "boundary": "replace"},
    "truncate": {"type": "pruning", "boundary": "replace"},
    "bridge_break": {"type": "re-render", "boundary": "replace"},
}


def termgym_version() -> str:
    try:
        return version("termgym")
    except PackageNotFoundError:  # pragma: no cover - a source tree without its metadata
        return "0"


# -- a trial's transcript and record -----------------------------------------------------------------


def from_transcript(transcript: dict[str, Any], record: dict[str, Any] | None = None) -> dict[str, Any]:
    """One trial's ATIF trajectory from its transcript (``termgym.transcript``) and record (when
    the run kept one)."""
    record = record or {}
    model = transcript.get("model") or record.get("model")
    steps: list[dict[str, Any]] = [_user(transcript.get("instruction") or "")]
    if transcript.get("harness") is not None and any(c.get("status") == 200 for c in transcript.get("calls") or []):
        steps += _harness_steps(transcript, model)
    else:
        steps += _turn_steps(transcript, model)
    _number(steps)
    usage = transcript.get("usage") or record.get("usage") or {}
    final: dict[str, Any] = {"total_steps": len(steps), "extra": _verifier(record, transcript)}
    if usage.get("requests"):
        final["total_prompt_tokens"] = int(usage.get("prompt_tokens") or 0)
        final["total_completion_tokens"] = int(usage.get("completion_tokens") or 0)
    segments = transcript.get("segments") or []
    extra = {
        "transcript_schema": transcript.get("schema"),
        "task": transcript.get("task") or record.get("task"),
        "stop_reason": transcript.get("stop_reason"),
        "parse_errors": transcript.get("parse_errors", 0),
        "summaries": transcript.get("summaries", 0),
        "segments": [{k: s.get(k) for k in ("index", "reason", "bridges", "bridge_breaks")} for s in segments],
        "notes": transcript.get("notes") or [],
        "record": {k: v for k, v in record.items() if k not in VERIFIER_FIELDS and k != "transcript"},
    }
    if transcript.get("harness") is not None:
        extra["harness"] = {k: v for k, v in transcript["harness"].items() if k != "messages"}
    trial = transcript.get("trial_id") or record.get("trial_id") or ""
    return _trajectory(
        session=record.get("run_id") or trial,
        trial=trial,
        agent=_agent(transcript.get("agent") or record.get("agent") or "termgym", model),
        steps=steps,
        final=final,
        extra=extra,
    )


def _turn_steps(transcript: dict[str, Any], model: str | None) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    reasons = {s.get("index"): s.get("reason") for s in transcript.get("segments") or []}
    chain: list[int] | None = None  # the last prompt and completion, to rebuild a bridged prompt
    segment = 0
    for turn in transcript.get("turns") or []:
        if turn.get("segment", 0) != segment:
            segment = turn.get("segment", 0)
            reason = reasons.get(segment) or "start"
            steps.append(_context_step(reason))
            chain = None
        reply, action, result = turn.get("reply"), turn.get("action") or {}, turn.get("result")
        step: dict[str, Any] = {"source": "agent", "message": (reply or {}).get("content") or ""}
        termgym: dict[str, Any] = {"turn": turn.get("index"), "segment": segment, "action": action}
        calls = _reply_calls(reply, action, turn.get("index", len(steps)))
        if calls:
            step["tool_calls"] = calls
        if reply is None:
            step["llm_call_count"] = 0
        else:
            step["llm_call_count"] = 1
            if model:
                step["model_name"] = model
            if reply.get("reasoning"):
                step["reasoning_content"] = reply["reasoning"]
            metrics, chain = _reply_metrics(reply, chain)
            step["metrics"] = metrics
            termgym.update({k: reply.get(k) for k in ("finish_reason", "latency")})
        observation = _observation(turn, result, calls)
        if observation is not None:
            step["observation"] = observation
        step["extra"] = {"termgym": termgym}
        steps.append(step)
    return steps


def _reply_calls(reply: dict[str, Any] | None, action: dict[str, Any], index: int) -> list[dict[str, Any]]:
    """The model's own tool calls, or the command it typed in text (or an agent without a model ran)."""
    own = (reply or {}).get("tool_calls") or []
    if own:
        return [
            {
                "tool_call_id": str(call.get("id") or f"call_{index}_{n}"),
                "function_name": str(call.get("name") or ""),
                "arguments": _arguments(call.get("arguments")),
            }
            for n, call in enumerate(own)
        ]
    if action.get("kind") != "command":
        return []
    arguments: dict[str, Any] = {"command": action.get("command", "")}
    if action.get("timeout") is not None:
        arguments["timeout"] = action["timeout"]
    marker = "parsed_from_text" if reply is not None else "dispatched"
    return [
        {
            "tool_call_id": f"call_{index}",
            "function_name": "bash",
            "arguments": arguments,
            "extra": {"termgym": {marker: True}},
        }
    ]


def _arguments(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            return {"raw": value}
        return parsed if isinstance(parsed, dict) else {"raw": value}
    return {} if value is None else {"raw": value}


def _reply_metrics(reply: dict[str, Any], chain: list[int] | None) -> tuple[dict[str, Any], list[int] | None]:
    """A reply's metrics, and the ids it leaves for the next prompt's bridge (None: unknown)."""
    usage = reply.get("usage") or {}
    metrics: dict[str, Any] = {
        "prompt_tokens": int(usage.get("prompt_tokens") or 0),
        "completion_tokens": int(usage.get("completion_tokens") or 0),
    }
    tokens = reply.get("tokens") or {}
    completion = tokens.get("completion_ids")
    if completion is None:
        return metrics, None
    prompt = tokens.get("prompt_ids")
    if prompt is None and chain is not None and tokens.get("bridge_ids") is not None:
        prompt = chain + list(tokens["bridge_ids"])
    if prompt is not None:
        metrics["prompt_token_ids"] = list(prompt)
    metrics["completion_token_ids"] = list(completion)
    if tokens.get("logprobs") is not None:
        metrics["logprobs"] = list(tokens["logprobs"])
    return metrics, (list(prompt) + list(completion)) if prompt is not None else None


def _observation(
    turn: dict[str, Any], result: dict[str, Any] | None, calls: Sequence[dict[str, Any]]
) -> dict[str, Any] | None:
    shown = turn.get("observation")
    if result is None and shown is None:
        return None
    entry: dict[str, Any] = {"content": shown if shown is not None else (result or {}).get("output", "")}
    if calls:
        entry["source_call_id"] = calls[0]["tool_call_id"]
    if result is not None:
        facts = {k: result.get(k) for k in ("exit_code", "timed_out", "duration", "cwd", "dropped_bytes")}
        if result.get("output") != entry["content"]:
            facts["output"] = result.get("output")
        entry["extra"] = {"termgym": facts}
    return {"results": [entry]}


def _context_step(reason: str) -> dict[str, Any]:
    management = CONTEXT_REWRITES.get(reason, {"type": reason, "boundary": "replace"})
    return {
        "source": "system",
        "message": f"the agent's context was rewritten ({reason}); later prompts start from it",
        "extra": {"context_management": management, "termgym": {"segment_reason": reason}},
    }


def _harness_steps(transcript: dict[str, Any], model: str | None) -> list[dict[str, Any]]:
    """One agent step per answered model call of a harness; each command the harness ran is
    attached (``_owners``) to the call whose reply asked for it."""
    turns = [t for t in transcript.get("turns") or [] if (t.get("action") or {}).get("kind") == "command"]
    answered = [c for c in transcript.get("calls") or [] if c.get("status") == 200]
    messages = [_call_message(call) for call in answered]
    calls_of = [
        [
            {
                "tool_call_id": str(c.get("id") or f"call_{n}_{k}"),
                "function_name": str((c.get("function") or {}).get("name") or ""),
                "arguments": _arguments((c.get("function") or {}).get("arguments")),
            }
            for k, c in enumerate(message.get("tool_calls") or [])
            if isinstance(c, dict)
        ]
        for n, message in enumerate(messages)
    ]
    asked = [
        [str(c["arguments"].get("command", "")) for c in calls] or [str(message.get("content") or "")]
        for calls, message in zip(calls_of, messages)
    ]
    owners = _owners([str(t["action"].get("command", "")) for t in turns], asked)
    steps: list[dict[str, Any]] = []
    for n, (call, message, calls) in enumerate(zip(answered, messages, calls_of)):
        step: dict[str, Any] = {"source": "agent", "message": str(message.get("content") or ""), "llm_call_count": 1}
        if model:
            step["model_name"] = model
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        if reasoning:
            step["reasoning_content"] = str(reasoning)
        if calls:
            step["tool_calls"] = calls
        step["metrics"] = _call_metrics(call)
        results = []
        for k, turn in enumerate(t for t, owner in zip(turns, owners) if owner == n):
            result = turn.get("result") or {}
            entry: dict[str, Any] = {"content": result.get("output", "")}
            if k < len(calls):
                entry["source_call_id"] = calls[k]["tool_call_id"]
            facts = {f: result.get(f) for f in ("exit_code", "timed_out", "duration")}
            entry["extra"] = {"termgym": {"turn": turn.get("index"), "command": turn["action"].get("command"), **facts}}
            results.append(entry)
        if results:
            step["observation"] = {"results": results}
        step["extra"] = {"termgym": {"call": call.get("index"), "latency": call.get("latency")}}
        steps.append(step)
    return steps


def _owners(commands: Sequence[str], asked: Sequence[Sequence[str]]) -> list[int]:
    """Pure: for each command run, in order, the call it answers: the first call from the last
    owner on (after it, once that one owns a command) that asked for it (``_names``); the last
    owner when none did (a command no reply names stays with the call before it)."""
    owners: list[int] = []
    pointer, owned = 0, False
    for command in commands:
        first = pointer + 1 if owned else pointer
        found = next((i for i in range(first, len(asked)) if _names(command, asked[i])), None)
        if found is not None:
            pointer = found
        owners.append(min(pointer, max(len(asked) - 1, 0)))
        owned = True
    return owners


def _names(command: str, asked: Sequence[str]) -> bool:
    """Whether a reply asked for ``command``: its text holds the command (a fenced block), or the
    command holds what a tool call asked (a harness wraps it: ``cd``, exports, a subshell)."""
    return bool(command) and any(text and (command in text or text in command) for text in asked)


def _call_message(call: dict[str, Any]) -> dict[str, Any]:
    response = call.get("response") or {}
    choices = response.get("choices") if isinstance(response, dict) else None
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        choice = choices[0]
        if isinstance(choice.get("message"), dict):
            return choice["message"]
        return {"content": choice.get("text") or ""}
    return {"content": ""}


def _call_metrics(call: dict[str, Any]) -> dict[str, Any]:
    usage = call.get("usage") or {}
    metrics: dict[str, Any] = {}
    for name in ("prompt_tokens", "completion_tokens"):
        if usage.get(name) is not None:
            metrics[name] = int(usage[name])
    if call.get("prompt_ids") is not None:
        metrics["prompt_token_ids"] = list(call["prompt_ids"])
    if call.get("completion_ids") is not None:
        metrics["completion_token_ids"] = list(call["completion_ids"])
    if call.get("logprobs") is not None:
        metrics["logprobs"] = list(call["logprobs"])
    return metrics


# -- a training run's token samples ----------------------------------------------------------------


def from_token_samples(
    task: str,
    instruction: str,
    samples: Sequence[dict[str, Any]],
    *,
    commands: Sequence[str] = (),
    record: dict[str, Any] | None = None,
    tokenizer: str | None = None,
    kind: str = "demonstration",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A training run's episode (a demonstration, or a rollout's samples: each ``{"ids", "mask",
    "logprobs"?, "reason"?}``) as a trajectory: each run of sampled ids (mask 1) is one agent step
    whose prompt is every id of its sample before it; a sample after the first opens with a
    context step. The n-th agent step calls the n-th command when ``commands`` are given (the
    step after them is the submit)."""
    record = record or {}
    steps: list[dict[str, Any]] = [_user(instruction)]
    typed = 0
    for number, sample in enumerate(samples):
        ids, mask, logprobs = sample["ids"], sample["mask"], sample.get("logprobs")
        if number:
            steps.append(_context_step(str(sample.get("reason") or "start")))
        for start, end in sampled_runs(mask):
            metrics: dict[str, Any] = {
                "prompt_tokens": start,
                "completion_tokens": end - start,
                "prompt_token_ids": list(ids[:start]),
                "completion_token_ids": list(ids[start:end]),
            }
            if logprobs:
                metrics["logprobs"] = [float(x) for x in logprobs[start:end]]
            step: dict[str, Any] = {"source": "agent", "message": "", "llm_call_count": 1, "metrics": metrics}
            if typed < len(commands):
                step["tool_calls"] = [
                    {
                        "tool_call_id": f"call_{typed}",
                        "function_name": "bash",
                        "arguments": {"command": commands[typed]},
                        "extra": {"termgym": {"parsed_from_text": True}},
                    }
                ]
            typed += 1
            steps.append(step)
    _number(steps)
    final = {
        "total_steps": len(steps),
        "total_completion_tokens": sum(sum(s["mask"]) for s in samples),
        "extra": _verifier(record, {"stop_reason": record.get("stop_reason")}),
    }
    return _trajectory(
        session=record.get("run_id") or task,
        trial=record.get("trial_id") or "",
        agent=_agent(record.get("agent") or kind, record.get("model")),
        steps=steps,
        final=final,
        extra={
            "task": task,
            "kind": kind,
            "tokenizer": tokenizer,
            "commands": list(commands),
            **(extra or {}),
            "record": {k: v for k, v in record.items() if k not in VERIFIER_FIELDS},
        },
    )


def sampled_runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """Pure: [start, end) of each maximal run of 1s in ``mask``."""
    runs, start = [], None
    for i, m in enumerate([*mask, 0]):
        if m and start is None:
            start = i
        elif not m and start is not None:
            runs.append((start, i))
            start = None
    return runs


def tokenizer_fingerprint(model_dir: str | Path) -> str | None:
    """What the ids mean in ``model_dir``'s ``tokenizer.json``: a SHA-256 over its model type,
    vocabulary and added tokens (not its bytes: a tokenizer saved again is the same); None when
    the directory has no readable ``tokenizer.json``."""
    try:
        data = json.loads((Path(model_dir) / "tokenizer.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    model = data.get("model") or {}
    vocab = model.get("vocab")
    pairs = sorted(vocab.items()) if isinstance(vocab, dict) else vocab
    added = sorted((t.get("id"), t.get("content")) for t in data.get("added_tokens") or [])
    canonical = json.dumps([model.get("type"), pairs, added], ensure_ascii=False, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


# -- shared pieces ----------------------------------------------------------------------------------


def _user(instruction: str) -> dict[str, Any]:
    return {"source": "user", "message": instruction}


def _agent(name: str, model: str | None) -> dict[str, Any]:
    agent: dict[str, Any] = {"name": name, "version": termgym_version(), "extra": {"producer": "termgym"}}
    if model:
        agent["model_name"] = model
    return agent


def _number(steps: list[dict[str, Any]]) -> None:
    """Number the steps from 1, ``step_id`` first in each (as people read them)."""
    for number, step in enumerate(steps, start=1):
        fields = dict(step)
        step.clear()
        step.update(step_id=number, **fields)


def _verifier(record: dict[str, Any], transcript: dict[str, Any]) -> dict[str, Any]:
    found = {k: record[k] for k in VERIFIER_FIELDS if k in record}
    found["stop_reason"] = transcript.get("stop_reason") or record.get("stop_reason")
    return found


def _trajectory(
    *,
    session: str,
    trial: str,
    agent: dict[str, Any],
    steps: list[dict[str, Any]],
    final: dict[str, Any],
    extra: dict[str, Any],
) -> dict[str, Any]:
    out: dict[str, Any] = {"schema_version": SCHEMA_VERSION}
    if session:
        out["session_id"] = session
    if trial:
        out["trajectory_id"] = trial
    out.update(agent=agent, steps=steps, final_metrics=final, extra={"termgym": extra})
    return out


def read_trajectories(paths: Sequence[str | Path]) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Every ATIF trajectory under ``paths`` (files, or directories searched for ``*.json``), in
    path order, each checked (``check``); a file that is not one raises ``ValueError`` naming it
    and its first problem. A JSON file without ``schema_version`` in a directory is skipped (a
    directory may hold other JSON)."""
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise ValueError(f"{path}: no such file or directory")
        files = sorted(path.rglob("*.json")) if path.is_dir() else [path]
        for file in files:
            try:
                data = json.loads(file.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ValueError(f"{file}: not JSON ({exc})") from exc
            if path.is_dir() and not (isinstance(data, dict) and "schema_version" in data):
                continue
            problems = check(data)
            if problems:
                raise ValueError(f"{file}: not an ATIF trajectory: {problems[0]}")
            yield file, data
