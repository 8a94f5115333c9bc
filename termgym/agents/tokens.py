"""Token-exact sessions: termgym renders the conversation itself, with the model family's renderer
(``termgym.agents.renderers``), and a backend samples from token ids. The same session serves the
tokens client (``TokensClient``: any server with vLLM's ``/v1/completions`` token-id prompts and
``return_token_ids``) and the trainer's in-process samplers (``termgym.trainer.policy_client``):
one episode loop, one rendering, for evaluation and training.

Per segment (``RenderedSession``)::

    ids = render(opening) + sampled_1 + bridge_1 + sampled_2 + ...

where each ``sampled_t`` is exactly what the backend returned and each bridge is the only text
tokenized after the first prompt (``Renderer.bridge``). ``mask`` is 1 on sampled ids only and
``logprobs`` holds the backend's log-prob of each (the server's processed log-probs: run it with
``--logprobs-mode processed_logprobs`` when sampling at a temperature other than 1). A bridge the
renderer cannot keep (stripped thinking, a template that re-renders differently) is counted in the
segment's ``bridge_breaks`` and the session continues in a new segment from a full render: a new
token sample, never a silent re-tokenization. A reply cut short (no stop id at its end) gets the
renderer's close id as context outside the loss.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from termgym.agents.client import Completion
from termgym.agents.prompts import cut_token_ids
from termgym.agents.renderers import ParsedReply, Renderer
from termgym.agents.transport import Server, call, int_list, json_body, post
from termgym.errors import ConfigError, ContextExceeded, ModelError
from termgym.transcript import Segment, Transcript


def load_tokenizer(path: str) -> Any:
    """The tokenizer at ``path`` (a local model directory, or a hub name on a machine online)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ConfigError("the tokens client needs transformers (pip install -e '.[train]')") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the tokenizer {path!r}: {' '.join(str(exc).split())[:300]}") from None
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"the tokenizer {path!r} has no end-of-turn (eos) token")
    return tokenizer


@dataclass
class Generated:
    """What a backend sampled: the ids as sampled (the stop id included when it stopped on one),
    the log-prob of each, and why it stopped (``stop`` or ``length``)."""

    ids: list[int]
    logprobs: list[float]
    finish_reason: str = "stop"


class Backend(Protocol):
    async def generate(
        self, segment: Segment, max_tokens: int, stop_ids: tuple[int, ...], deadline: float
    ) -> Generated:
        """Sample after ``segment.ids`` (the segment's prompt so far), at most ``max_tokens`` ids,
        ending at the first of ``stop_ids``; answered by ``deadline`` (``time.monotonic()``)."""
        ...


@dataclass
class RenderedSession:
    """One episode's token-exact conversation (module docstring). ``window`` answers the context
    length (None: unknown); ``max_observation_tokens`` cuts observations head and tail."""

    transcript: Transcript
    renderer: Renderer
    backend: Backend
    window: Callable[[float | None], Awaitable[int | None]]
    max_observation_tokens: int | None = None
    _segment: Segment | None = None
    _covered: int = 0  # messages the segment's ids cover, the last reply included
    _history: list[dict[str, Any]] = field(default_factory=list)
    _closed: bool = True

    async def complete(
        self, messages: list[dict[str, Any]], *, tools: list[dict] | None, max_tokens: int, deadline: float
    ) -> Completion:
        segment, bridge = self._extend(messages, tools)
        window = await self.window(deadline)
        budget = max_tokens if window is None else min(max_tokens, window - len(segment.ids))
        if budget < 1:
            raise ContextExceeded(f"the prompt has {len(segment.ids)} tokens: no room left in {window}")
        started = time.monotonic()
        prompt_ids = list(segment.ids)
        out = await self.backend.generate(segment, budget, self.renderer.stop_ids, deadline)
        if len(out.logprobs) != len(out.ids):
            raise ModelError(f"the completion has {len(out.ids)} token ids but {len(out.logprobs)} log-probs")
        segment.ids += out.ids
        segment.mask += [1] * len(out.ids)
        segment.logprobs += out.logprobs
        parsed = self.renderer.parse(out.ids)
        self._closed = bool(out.ids) and out.ids[-1] in self.renderer.stop_ids
        completion = _completion(parsed, out.finish_reason, tools is not None)
        completion.prompt_ids, completion.completion_ids, completion.logprobs = prompt_ids, out.ids, out.logprobs
        completion.prompt_tokens, completion.completion_tokens = len(prompt_ids), len(out.ids)
        completion.bridge, completion.latency = bridge, time.monotonic() - started
        self._covered, self._history = len(messages) + 1, [*messages, completion.message]
        return completion

    def new_segment(self, reason: str) -> None:
        self._segment = self.transcript.new_segment(reason)
        self._covered, self._history, self._closed = 0, [], True

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int | None:
        if self._segment is None or not self._segment.ids:
            return None
        added = sum(len(self.renderer.encode(str(m.get("content") or ""))) for m in messages[self._covered :])
        return len(self._segment.ids) + added + 16 * max(1, len(messages) - self._covered)

    def cut_tokens(self, text: str) -> str:
        limit = self.max_observation_tokens
        if limit is None:
            return text
        cut = cut_token_ids(self.renderer.encode(text), limit, self.renderer.tokenizer.decode)
        return text if cut is None else cut

    def _extend(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> tuple[Segment, list[int] | None]:
        """The segment with ``messages`` rendered onto its ids, and the bridge (None: a full render)."""
        if self._segment is None:
            self._segment = self.transcript.segment
        segment = self._segment
        if segment.ids and self._history:
            if len(messages) <= self._covered or messages[self._covered - 1] != self._history[-1]:
                raise ModelError("the history was rewritten without a new segment")
            bridge = self.renderer.bridge(self._history, messages[self._covered :], tools=tools)
            if bridge is not None:
                bridge = ([] if self._closed else [self.renderer.close_id]) + bridge
                segment.ids += bridge
                segment.mask += [0] * len(bridge)
                segment.logprobs += [0.0] * len(bridge)
                segment.bridges += 1
                return segment, bridge
            segment.bridge_breaks += 1
            segment.messages = [dict(m) for m in self._history]  # what the ended segment's ids cover
            self.transcript.notes.append(f"turn {len(self.transcript.turns)}: the prefix could not be kept")
            segment = self._segment = self.transcript.new_segment("bridge_break")
        prompt = self.renderer.render(messages, tools=tools, add_generation_prompt=True)
        segment.ids, segment.mask, segment.logprobs = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
        return segment, None


def _completion(parsed: ParsedReply, finish_reason: str, tool_format: bool) -> Completion:
    """The agent's view of a parsed reply; tool calls count only in the tool format."""
    calls = parsed.tool_calls if tool_format else []
    content = parsed.content
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    if calls:
        message["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name or "", "arguments": template_arguments(c.arguments)},
            }
            for c in calls
        ]
    return Completion(content, calls, finish_reason, message, reasoning=parsed.reasoning)


def template_arguments(value: Any) -> Any:
    """Tool-call arguments as chat templates expect them: a mapping when they are JSON text of an
    object, else as they are (other text, or arguments already a mapping)."""
    import json

    if not isinstance(value, str):
        return value
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError:
        return value
    return parsed if isinstance(parsed, dict) else value


# -- the tokens client: a server's /v1/completions with token-id prompts ---------------------------


@dataclass
class CompletionsBackend:
    """Samples through ``/v1/completions`` of a vLLM-compatible server: token-id prompt,
    ``return_token_ids``, the sampled ids' log-probs, special tokens kept."""

    server: Server
    temperature: float = 1.0

    async def generate(
        self, segment: Segment, max_tokens: int, stop_ids: tuple[int, ...], deadline: float
    ) -> Generated:
        body = completions_body(self.server.model, segment.ids, max_tokens, stop_ids, self.temperature)
        describe = f"{self.server.endpoint.base_url} completion"
        response = json_body(await call(post(self.server.sdk, "/completions", body), deadline, describe), describe)
        return parse_completions_response(response)


def completions_body(
    model: str, prompt: list[int], max_tokens: int, stop_ids: tuple[int, ...], temperature: float, **extra: Any
) -> dict[str, Any]:
    """The ``/v1/completions`` request of one turn (vLLM's token-in, token-out fields)."""
    return {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "logprobs": 1,
        "return_token_ids": True,
        "skip_special_tokens": False,
        "stop_token_ids": list(stop_ids),
        **extra,
    }


def parse_completions_response(response: dict[str, Any]) -> Generated:
    """The first choice's sampled ids, their log-probs and finish reason; ``ModelError`` when the
    server returned no token ids (it needs ``return_token_ids``)."""
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    ids = int_list(choice.get("token_ids"))
    if ids is None:
        raise ModelError("the completion has no token ids: the tokens client needs a server with return_token_ids")
    scores = choice.get("logprobs")
    raw = (scores.get("token_logprobs") if isinstance(scores, dict) else None) or []
    logprobs = [float(x) if x is not None else 0.0 for x in raw]
    return Generated(ids, logprobs, str(choice.get("finish_reason") or "stop"))


@dataclass
class TokensClient:
    server: Server
    renderer: Renderer
    temperature: float = 1.0
    max_observation_tokens: int | None = None

    @property
    def model(self) -> str:
        return self.server.model

    def session(self, transcript: Transcript) -> RenderedSession:
        backend = CompletionsBackend(self.server, self.temperature)
        return RenderedSession(transcript, self.renderer, backend, self.context_window, self.max_observation_tokens)

    async def context_window(self, deadline: float | None = None) -> int | None:
        return await self.server.context_window(deadline)

    async def aclose(self) -> None:
        await self.server.aclose()
