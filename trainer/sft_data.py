"""Supervised rows from ATIF trajectories (``termgym train --sft-data PATH``): termgym's exports
(``termgym export atif``) or any harness's, as the ``(ids, mask)`` rows the supervised warm start
trains (``trainer/sft.py``), mask 1 on what the agent typed.

Per trajectory, one of two ways:
* **token ids as they are**, when the trajectory's ids are the policy's (its tokenizer fingerprint,
  ``termgym.atif.tokenizer_fingerprint``, equals the policy's, or ``--sft-data-tokens ids``),
  chained by the gateway's bridge rule (``merge_calls``);
* **the messages rendered** with the policy's renderer otherwise (``--sft-data-tokens render``
  always), bridged turn to turn as an episode is (a bridge it cannot keep starts a new row).

Every agent step is accounted for: trained (``from_ids``, ``rendered``), or counted under a reason
in ``unfit``, never dropped silently. The reasons, and each way in full:
docs/guides/atif.md#training-from-atif."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from termgym import atif
from termgym.agents.renderers import Renderer
from termgym.gateway.calls import Call, merge_calls

TokenUse = Literal["auto", "ids", "render"]
TOKEN_USES: tuple[TokenUse, ...] = ("auto", "ids", "render")

COPIED = "copied context (the RFC keeps it out of SFT)"
DISPATCHED = "no model call (llm_call_count 0; the RFC keeps it out of SFT)"
NO_IDS = "without token ids in a trajectory trained on its ids"
VOCAB = "ids outside the policy's vocabulary"
CONTEXT = "in a row beyond --max-context"
NO_TEXT = "nothing to render (token ids of another tokenizer, no text)"
IMAGES = "images the renderer cannot take"
SUBAGENTS = "in embedded subagent trajectories (give them as files of their own)"


@dataclass
class SftData:
    rows: list[tuple[list[int], list[int]]] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)  # the task (or file) of each row
    commands: list[tuple[str, ...]] = field(default_factory=list)  # each row's trajectory's commands
    trajectories: int = 0
    from_ids: int = 0  # agent steps trained on their own token ids
    rendered: int = 0  # agent steps trained as the renderer's ids of their messages
    unfit: Counter = field(default_factory=Counter)  # reason -> agent steps not trained
    bridge_breaks: int = 0  # rendered turns whose prefix the renderer could not keep (a new row)

    def describe(self) -> str:
        line = (
            f"{len(self.rows)} rows from {self.trajectories} ATIF trajectories: {self.from_ids} agent steps"
            f" on their token ids, {self.rendered} rendered"
        )
        if self.unfit:
            line += "; not trained: " + ", ".join(f"{n} {reason}" for reason, n in sorted(self.unfit.items()))
        return line

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": len(self.rows),
            "trajectories": self.trajectories,
            "from_ids": self.from_ids,
            "rendered": self.rendered,
            "bridge_breaks": self.bridge_breaks,
            "unfit": dict(self.unfit),
        }


def load_sft_data(
    paths: Sequence[str | Path],
    renderer: Renderer,
    *,
    max_context: int,
    fingerprint: str | None,
    tokens: TokenUse = "auto",
) -> SftData:
    """The rows of every ATIF trajectory under ``paths`` (``termgym.atif.read_trajectories``:
    a file that is not ATIF raises ``ValueError`` naming it)."""
    data = SftData()
    vocabulary = len(renderer.tokenizer)
    for path, trajectory in atif.read_trajectories(paths):
        data.trajectories += 1
        if embedded := _subagent_steps(trajectory):
            data.unfit[SUBAGENTS] += embedded
        termgym = (trajectory.get("extra") or {}).get("termgym") or {}
        name = str(termgym.get("task") or path.stem)
        steps = trajectory["steps"]
        trainable = [s for s in steps if s["source"] == "agent" and _trainable(s, data.unfit)]
        own = tokens == "ids" or (
            tokens == "auto" and fingerprint is not None and termgym.get("tokenizer") == fingerprint
        )
        rows = _from_ids(trainable, data) if own else _rendered(trajectory, renderer, data)
        commands = tuple(
            str(call["arguments"]["command"])
            for step in steps
            for call in step.get("tool_calls") or []
            if "command" in call["arguments"]
        )
        for ids, mask, count in rows:
            if any(i < 0 or i >= vocabulary for i in ids):
                data.unfit[VOCAB] += count
            elif len(ids) > max_context:
                data.unfit[CONTEXT] += count
            else:
                data.rows.append((ids, mask))
                data.tasks.append(name)
                data.commands.append(commands)
                if own:
                    data.from_ids += count
                else:
                    data.rendered += count
    return data


def _subagent_steps(trajectory: dict[str, Any]) -> int:
    """Agent steps of the trajectories embedded in ``trajectory`` (v1.7), nested ones included."""
    total = 0
    for sub in trajectory.get("subagent_trajectories") or []:
        if isinstance(sub, dict):
            steps = sub.get("steps") or []
            total += sum(1 for s in steps if isinstance(s, dict) and s.get("source") == "agent")
            total += _subagent_steps(sub)
    return total


def _trainable(step: dict[str, Any], unfit: Counter) -> bool:
    if step.get("is_copied_context"):
        unfit[COPIED] += 1
        return False
    if step.get("llm_call_count") == 0:
        unfit[DISPATCHED] += 1
        return False
    return True


def _from_ids(steps: list[dict[str, Any]], data: SftData) -> list[tuple[list[int], list[int], int]]:
    """Rows of the steps' own ids, chained by the bridge rule; each with its count of steps."""
    calls = []
    for step in steps:
        metrics = step.get("metrics") or {}
        prompt, completion = metrics.get("prompt_token_ids"), metrics.get("completion_token_ids")
        if prompt is None or completion is None:
            data.unfit[NO_IDS] += 1
            continue
        calls.append(Call(len(calls), "", {}, status=200, prompt_ids=prompt, completion_ids=completion, logprobs=[]))
    merged = merge_calls(calls)
    return [(s.ids, s.mask, len(atif.sampled_runs(s.mask))) for s in merged.segments]


def _rendered(trajectory: dict[str, Any], renderer: Renderer, data: SftData) -> list[tuple[list[int], list[int], int]]:
    """Rows of the messages rendered turn by turn (module docstring); each with its count of
    trained steps."""
    tools = (trajectory.get("agent") or {}).get("tool_definitions") or None
    rows: list[tuple[list[int], list[int], int]] = []
    history: list[dict[str, Any]] = []
    pending: list[dict[str, Any]] = []
    ids: list[int] = []
    mask: list[int] = []
    count = 0

    def close() -> None:
        nonlocal ids, mask, count
        if count:
            rows.append((ids, mask, count))
        ids, mask, count = [], [], 0

    steps = trajectory["steps"]
    if any(_has_image(s) for s in steps):
        data.unfit[IMAGES] += sum(1 for s in steps if s["source"] == "agent" and _trainable(s, Counter()))
        return []
    for step in steps:
        source = step["source"]
        if source != "agent":
            management = (step.get("extra") or {}).get("context_management") or {}
            if management.get("boundary") == "replace":  # the context is what the step's results hold
                close()
                history = []
                pending = [{"role": "user", "content": _results_text(step) or _text(step.get("message"))}]
            else:
                pending.append({"role": source, "content": _text(step.get("message"))})
            continue
        trained = bool(step.get("llm_call_count") != 0 and not step.get("is_copied_context"))
        message, called = _assistant(step)
        if trained and not message.get("content") and not message.get("tool_calls"):
            data.unfit[NO_TEXT] += 1
            trained = False
        if ids and history:
            bridge = renderer.bridge(history, pending, tools=tools)
            if bridge is None:
                data.bridge_breaks += 1
                close()
            else:
                ids, mask = ids + bridge, mask + [0] * len(bridge)
        if not ids:
            ids = renderer.render([*history, *pending], tools=tools, add_generation_prompt=True)
            mask = [0] * len(ids)
        reply = renderer.render_assistant(message)
        ids, mask = ids + reply, mask + [int(trained)] * len(reply)
        count += int(trained)
        history, pending = [*history, *pending, message], []
        for result in (step.get("observation") or {}).get("results") or []:
            content = _text(result.get("content"))
            call_id = result.get("source_call_id")
            if call_id is not None and call_id in called:
                pending.append({"role": "tool", "tool_call_id": call_id, "content": content})
            else:
                pending.append({"role": "user", "content": content})
    close()
    return rows


def _assistant(step: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """The step's reply as the assistant message the renderer takes, and the ids of the calls it
    makes as tool calls (a command termgym parsed from text stays in the text)."""
    message: dict[str, Any] = {"role": "assistant", "content": _text(step.get("message"))}
    if step.get("reasoning_content"):
        message["reasoning_content"] = step["reasoning_content"]
    calls = [
        c
        for c in step.get("tool_calls") or []
        if not ((c.get("extra") or {}).get("termgym") or {}).get("parsed_from_text")
    ]
    if calls:
        message["tool_calls"] = [
            {
                "id": c["tool_call_id"],
                "type": "function",
                "function": {"name": c["function_name"], "arguments": c["arguments"]},
            }
            for c in calls
        ]
    return message, {c["tool_call_id"] for c in calls}


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(str(part.get("text") or "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def _results_text(step: dict[str, Any]) -> str:
    return "\n".join(_text(r.get("content")) for r in (step.get("observation") or {}).get("results") or [])


def _has_image(step: dict[str, Any]) -> bool:
    contents = [step.get("message"), *(r.get("content") for r in (step.get("observation") or {}).get("results") or [])]
    return any(
        isinstance(c, list) and any(isinstance(p, dict) and p.get("type") == "image" for p in c) for c in contents
    )


def write_report(path: Path, data: SftData) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data.to_dict(), indent=2) + "\n", encoding="utf-8")
