"""The structural rules of ATIF (Harbor's RFC 0001), checked on any trajectory: required fields and
their types, step ids from 1, the sources, agent-only fields, timestamps, tool results naming a call
of their step, token ids and log-probs. Pure; not a full schema (unknown fields are not refused)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

SOURCES = ("system", "user", "agent")
AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")


def check(data: Any) -> list[str]:
    """Pure: where ``data`` breaks the RFC's structural rules (required fields and their types,
    sequential step ids from 1, the sources, agent-only fields on agent steps only, ISO 8601
    timestamps, tool results naming a call of their step, token ids and log-probs as lists of the
    right kind); empty when it keeps them. Not a full schema: unknown fields are not refused."""
    if not isinstance(data, dict):
        return ["a trajectory is a JSON object"]
    problems = []
    if not (isinstance(data.get("schema_version"), str) and data["schema_version"].startswith("ATIF-v")):
        problems.append("schema_version: not an ATIF version (ATIF-vX.Y)")
    agent = data.get("agent")
    if not (isinstance(agent, dict) and isinstance(agent.get("name"), str) and isinstance(agent.get("version"), str)):
        problems.append("agent: needs a name and a version (strings)")
    steps = data.get("steps")
    if not isinstance(steps, list):
        return [*problems, "steps: not a list"]
    for number, step in enumerate(steps, start=1):
        problems += [f"steps[{number - 1}]: {p}" for p in _check_step(step, number)]
    return problems


def _check_step(step: Any, number: int) -> list[str]:
    if not isinstance(step, dict):
        return ["not an object"]
    problems = []
    if step.get("step_id") != number:
        problems.append(f"step_id {step.get('step_id')!r}, expected {number}")
    source = step.get("source")
    if source not in SOURCES:
        problems.append(f"source {source!r} is none of {', '.join(SOURCES)}")
    if not isinstance(step.get("message"), (str, list)):
        problems.append("message: required, a string or a list of content parts")
    if source != "agent":
        problems += [f"{name}: only on agent steps" for name in AGENT_ONLY if step.get(name) is not None]
    if step.get("timestamp") is not None:
        try:
            datetime.fromisoformat(str(step["timestamp"]).replace("Z", "+00:00"))
        except ValueError:
            problems.append(f"timestamp {step['timestamp']!r} is not ISO 8601")
    calls = step.get("tool_calls")
    ids: set[str] = set()
    if calls is not None:
        if not isinstance(calls, list) or not all(_is_call(c) for c in calls):
            problems.append("tool_calls: each needs tool_call_id, function_name (strings) and arguments (an object)")
        else:
            ids = {c["tool_call_id"] for c in calls}
    observation = step.get("observation")
    if observation is not None:
        results = observation.get("results") if isinstance(observation, dict) else None
        if not isinstance(results, list):
            problems.append("observation: needs a list of results")
        else:
            for result in results:
                source_id = result.get("source_call_id") if isinstance(result, dict) else None
                if source_id is not None and source_id not in ids:
                    problems.append(f"observation names call {source_id!r}, which the step does not make")
    metrics = step.get("metrics")
    if isinstance(metrics, dict):
        for name, kind in (("prompt_token_ids", int), ("completion_token_ids", int), ("logprobs", (int, float))):
            value = metrics.get(name)
            if value is not None and not (isinstance(value, list) and all(isinstance(x, kind) for x in value)):
                problems.append(f"metrics.{name}: not a list of numbers")
    if step.get("llm_call_count") == 0 and source == "agent":
        problems += [f"{n}: absent when llm_call_count is 0" for n in ("metrics", "reasoning_content") if step.get(n)]
    return problems


def _is_call(call: Any) -> bool:
    return (
        isinstance(call, dict)
        and isinstance(call.get("tool_call_id"), str)
        and isinstance(call.get("function_name"), str)
        and isinstance(call.get("arguments"), dict)
    )
