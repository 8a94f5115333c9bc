"""OpenAI wire shapes the gateway reads and writes (pure functions, no I/O): the error envelope,
a chat completion built from a termgym ``Completion`` (for the in-process upstreams), and the
messages of a harness's request cleaned for a renderer and compared with what the model saw.

Comparison (``same_message``) is by meaning, not by bytes: harness libraries re-serialize the
assistant message they were given (litellm turns ``""`` into ``None``, adds ``function_call:
null``, keeps the arguments as text), so two messages are the same when their role, text, tool
calls (name and parsed arguments) and ``tool_call_id`` are.
"""

from __future__ import annotations

import json
import time
from typing import Any

from termgym.agents.client import Completion
from termgym.agents.tokens import template_arguments

_KEPT_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name", "reasoning_content")


def error_body(message: str, kind: str, code: str | int | None = None) -> dict[str, Any]:
    """The OpenAI error envelope (``{"error": {"message", "type", "param", "code"}}``)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


def text_of(content: Any) -> str:
    """A message's text: a string as it is, the text parts of a content list joined, else ``""``."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", "")) for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def clean_message(message: Any) -> dict[str, Any]:
    """A request message as a renderer takes it: role, text, tool calls (arguments as a mapping
    when they parse), ``tool_call_id``; anything else a harness carries (``extra``,
    ``function_call: null``, provider fields) dropped."""
    if not isinstance(message, dict):
        return {"role": "user", "content": str(message)}
    cleaned: dict[str, Any] = {k: message[k] for k in _KEPT_KEYS if message.get(k) is not None}
    cleaned["role"] = str(message.get("role") or "user")
    cleaned["content"] = text_of(message.get("content"))
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        cleaned["tool_calls"] = [
            {
                "id": str(call.get("id") or f"call_{i}"),
                "type": "function",
                "function": {
                    "name": str((call.get("function") or {}).get("name") or ""),
                    "arguments": template_arguments((call.get("function") or {}).get("arguments")),
                },
            }
            for i, call in enumerate(c for c in calls if isinstance(c, dict))
        ]
    else:
        cleaned.pop("tool_calls", None)
    return cleaned


def _meaning(message: Any) -> tuple:
    cleaned = clean_message(message)
    calls = tuple(
        (call["function"]["name"], json.dumps(call["function"]["arguments"], sort_keys=True))
        for call in cleaned.get("tool_calls", [])
    )
    return cleaned["role"], cleaned["content"].strip(), calls, cleaned.get("tool_call_id")


def same_message(a: Any, b: Any) -> bool:
    """Whether two messages say the same (module docstring)."""
    return _meaning(a) == _meaning(b)


def extends(history: list[dict[str, Any]], messages: list[Any]) -> bool:
    """Whether ``messages`` begins with ``history`` (message by message, ``same_message``) and adds
    at least one message after it."""
    return len(messages) > len(history) and all(same_message(h, m) for h, m in zip(history, messages))


def chat_response(completion: Completion, model: str, *, created: int | None = None) -> dict[str, Any]:
    """The ``chat.completion`` a vLLM server would answer for ``completion``: the message with its
    tool calls (arguments as JSON text), the finish reason (``tool_calls`` when it called one),
    usage, and vLLM's token fields (``prompt_token_ids``, ``choices[0].token_ids``, log-probs)."""
    message: dict[str, Any] = {"role": "assistant", "content": completion.content or None}
    if completion.reasoning is not None:
        message["reasoning_content"] = completion.reasoning
    if completion.tool_calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name or "", "arguments": c.arguments}}
            for c in completion.tool_calls
        ]
    finish = completion.finish_reason
    if completion.tool_calls and finish == "stop":
        finish = "tool_calls"
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish}
    if completion.completion_ids is not None:
        choice["token_ids"] = list(completion.completion_ids)
    if completion.logprobs is not None:
        choice["logprobs"] = {
            "content": [{"token": "", "logprob": lp, "top_logprobs": []} for lp in completion.logprobs]
        }
    body: dict[str, Any] = {
        "id": f"chatcmpl-termgym-{time.monotonic_ns():x}",
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [choice],
        "usage": {
            "prompt_tokens": completion.prompt_tokens,
            "completion_tokens": completion.completion_tokens,
            "total_tokens": completion.prompt_tokens + completion.completion_tokens,
        },
    }
    if completion.prompt_ids is not None:
        body["prompt_token_ids"] = list(completion.prompt_ids)
    return body
