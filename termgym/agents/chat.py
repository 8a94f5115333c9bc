"""The chat client: any OpenAI-compatible ``/v1/chat/completions`` server (vLLM, SGLang, a hosted
API), over ``termgym.agents.transport``. The server renders the chat template and parses tool
calls; the token-exact client is the tokens client (``termgym.agents.tokens``).

Guaranteed: each turn is one request with the session's settings (temperature, log-probs, the
tools in the tool format) and the faults of the transport (``ModelError``, ``ContextExceeded``,
``AgentDeadline``). A server that rejects the optional fields (``return_token_ids``,
``logprobs``: hosted APIs do) is asked again without them, once, and the client remembers (the
transcript's ``notes`` say so). When the server returns token ids, the transcript keeps the first
prompt's ids and after that only what each prompt adds (``bridge``) while the server's render of
the history stays a prefix; a render that changed keeps the whole prompt and is noted. Not
guaranteed: that those ids are what a trainer would render (the server's template is its own),
or that ``prompt_tokens`` is exact (an estimate from the last request's usage).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from termgym.agents.actions import ToolCall
from termgym.agents.client import Completion
from termgym.agents.transport import Server, call, int_list, json_body, post, rejected_field
from termgym.errors import ContextExceeded, ModelError
from termgym.transcript import Transcript

OPTIONAL_FIELDS = ("return_token_ids", "logprobs")  # asked for, dropped where a server rejects them


@dataclass
class ChatClient:
    """A model behind ``/v1/chat/completions``; the server renders the chat template and parses
    tool calls (vLLM: ``--enable-auto-tool-choice --tool-call-parser NAME``)."""

    server: Server
    temperature: float = 1.0
    logprobs: bool = True
    _dropped: set[str] = field(default_factory=set)

    @property
    def model(self) -> str:
        return self.server.model

    def session(self, transcript: Transcript) -> ChatSession:
        return ChatSession(self, transcript)

    async def context_window(self, deadline: float | None = None) -> int | None:
        return await self.server.context_window(deadline)

    async def aclose(self) -> None:
        await self.server.aclose()

    async def create(self, body: dict[str, Any], deadline: float, transcript: Transcript | None) -> dict[str, Any]:
        """``POST /chat/completions`` of ``body`` without the optional fields the server rejected."""
        describe = f"{self.server.endpoint.base_url} chat completion"
        while True:
            request = {k: v for k, v in body.items() if k not in self._dropped}
            try:
                return json_body(
                    await call(post(self.server.sdk, "/chat/completions", request), deadline, describe), describe
                )
            except ModelError as exc:
                optional = [k for k in OPTIONAL_FIELDS if k in request]
                name = None if isinstance(exc, ContextExceeded) else rejected_field(exc, optional)
                if name is None:
                    raise
                self._dropped.add(name)
                if transcript is not None:
                    transcript.notes.append(f"the server rejects {name}: asked without it")


@dataclass
class ChatSession:
    client: ChatClient
    transcript: Transcript
    _last_prompt_tokens: int | None = None
    _last_completion_tokens: int = 0
    _last_message_count: int = 0
    _seen: list[int] = field(default_factory=list)  # the server's last prompt and reply ids

    async def complete(
        self, messages: list[dict[str, Any]], *, tools: list[dict] | None, max_tokens: int, deadline: float
    ) -> Completion:
        client = self.client
        body: dict[str, Any] = {
            "model": client.model,
            "messages": messages,
            "temperature": client.temperature,
            "max_tokens": max_tokens,
            "return_token_ids": True,
        }
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if client.logprobs:
            body["logprobs"] = True
        started = time.monotonic()
        response = await client.create(body, deadline, self.transcript)
        completion = parse_chat_response(response)
        completion.latency = time.monotonic() - started
        self._last_prompt_tokens = completion.prompt_tokens
        self._last_completion_tokens = completion.completion_tokens
        self._last_message_count = len(messages)
        self._keep_extension(completion)
        return completion

    def _keep_extension(self, completion: Completion) -> None:
        """When the server's prompt extends its last prompt and reply (its render of the history is
        stable), keep only the new ids as the turn's bridge: the transcript stays linear in the
        episode's length. Otherwise the full prompt stays, and the change is noted."""
        if completion.prompt_ids is None or completion.completion_ids is None:
            return
        seen = self._seen
        prompt = completion.prompt_ids
        if seen and len(prompt) >= len(seen) and prompt[: len(seen)] == seen:
            completion.bridge = prompt[len(seen) :]
            seen.extend(completion.bridge)
        else:
            if seen:
                self.transcript.notes.append(
                    f"turn {len(self.transcript.turns)}: the server's render of the history changed"
                )
            self._seen = seen = list(prompt)
        seen.extend(completion.completion_ids)

    def new_segment(self, reason: str) -> None:
        self.transcript.new_segment(reason)
        self._last_prompt_tokens = None
        self._seen = []

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int | None:
        """An estimate: the last prompt and reply, plus about one token per three characters added."""
        if self._last_prompt_tokens is None:
            return None
        added = sum(len(str(m.get("content") or "")) for m in messages[self._last_message_count + 1 :])
        return self._last_prompt_tokens + self._last_completion_tokens + added // 3 + 8

    def cut_tokens(self, text: str) -> str:
        return text


def parse_chat_response(response: dict[str, Any]) -> Completion:
    """A chat completion's JSON to a ``Completion``; a response without a usable choice is a
    ``ModelError``. Read from the JSON, not the SDK's typed objects: building those is a third of
    the client's CPU per turn (one object per log-prob)."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ModelError("the chat completion has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ModelError("the chat completion's choice has no message")
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    calls = []
    for i, entry in enumerate(message.get("tool_calls") or []):
        function = entry.get("function") if isinstance(entry, dict) else None
        if isinstance(function, dict):
            name, arguments = function.get("name"), function.get("arguments")
            calls.append(
                ToolCall(
                    str(entry.get("id") or f"call_{i}"),
                    name if isinstance(name, str) and name else None,
                    arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
                )
            )
    text = message.get("content")
    content = text if isinstance(text, str) else ""
    history: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        history["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name or "", "arguments": c.arguments}}
            for c in calls
        ]
    logprobs = None
    content_logprobs = (
        (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    )
    if isinstance(content_logprobs, list) and content_logprobs:
        logprobs = [float(item.get("logprob", 0.0)) for item in content_logprobs]
    counts = response.get("usage")
    usage: dict[str, Any] = counts if isinstance(counts, dict) else {}
    return Completion(
        content=content,
        tool_calls=calls,
        finish_reason=str(choice.get("finish_reason") or "stop"),
        message=history,
        reasoning=reasoning if isinstance(reasoning, str) else None,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        prompt_ids=int_list(response.get("prompt_token_ids")),
        completion_ids=int_list(choice.get("token_ids")),
        logprobs=logprobs,
    )
