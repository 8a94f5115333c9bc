"""The tokens client: termgym renders the conversation with the model's tokenizer and sends token ids
to a token-in/token-out endpoint (vLLM's ``/v1/completions`` with a token-id prompt and
``return_token_ids``), so an episode's ids are exactly what was sampled: the mode training needs.

Rendering is incremental. A segment's first prompt is the tokenizer's chat template applied to the
messages; after that only what each turn adds is tokenized (``TemplateRenderer.bridge``): the
template renders ``[anchor, last reply]`` and ``[anchor, last reply, *new messages]``, and the ids
after the last reply's close token are the bridge. Sampled ids are never decoded and re-encoded.

Guaranteed, per segment: ``ids == first prompt + sampled_1 + bridge_1 + sampled_2 + ...`` exactly,
``mask`` is 1 on sampled ids only, ``logprobs`` holds the server's log-prob of each sampled id
(processed log-probs: run the server with ``--logprobs-mode processed_logprobs`` when sampling at
a temperature other than 1). Every bridge is checked for the prefix property (the anchor's render
is a prefix of the longer render); a template that breaks it is counted (``bridge_breaks``) and
the session starts a new segment from a full render: recorded, never silent. A reply cut short
(no close token) is closed with a synthesized close token that is not sampled (mask 0).

Text from the sandbox can hold a special token's spelling (``<|im_end|>``); each one in a message's
content is broken with a zero-width space before rendering, so no observation forges a turn.
Per-family renderers (Qwen3's thinking, Harmony) come with the trainer's renderers.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

from termgym.agents.actions import ToolCall, parse_hermes
from termgym.agents.client import Completion, ContextExceeded, ModelError, Server, call, int_list, json_body, post
from termgym.agents.prompts import cut_token_ids
from termgym.errors import ConfigError
from termgym.transcript import Segment, Transcript

ANCHOR = {"role": "user", "content": "."}
_THINK = re.compile(r"^\s*<think>(.*?)</think>\s*", re.DOTALL)


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
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"the tokenizer {path!r} has no chat template")
    if tokenizer.eos_token_id is None:
        raise ConfigError(f"the tokenizer {path!r} has no end-of-turn (eos) token")
    return tokenizer


class TemplateRenderer:
    """Messages to ids through the tokenizer's own chat template, and the bridge between turns."""

    def __init__(self, tokenizer: Any, *, tools: list[dict] | None = None, template_kwargs: dict | None = None):
        self.tokenizer = tokenizer
        self.tools = tools
        self.template_kwargs = dict(template_kwargs or {})
        self.close_id: int = tokenizer.eos_token_id
        specials = set(tokenizer.all_special_tokens) | set(getattr(tokenizer, "added_tokens_encoder", {}))
        self._specials = sorted((s for s in specials if len(s) > 1), key=len, reverse=True)

    def render(self, messages: list[dict[str, Any]], *, add_generation_prompt: bool) -> list[int]:
        text = self.tokenizer.apply_chat_template(
            [self._defang(m) for m in messages],
            tools=self.tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **self.template_kwargs,
        )
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def bridge(self, previous: dict[str, Any], new: list[dict[str, Any]]) -> list[int] | None:
        """The ids that follow ``previous`` (the last reply, through its close token) up to the next
        generation prompt; None when the template breaks the prefix property or has no close token
        after the reply."""
        base = self.render([ANCHOR, previous], add_generation_prompt=False)
        full = self.render([ANCHOR, previous, *new], add_generation_prompt=True)
        if full[: len(base)] != base or self.close_id not in base:
            return None
        cut = len(base) - 1 - base[::-1].index(self.close_id)
        return full[cut + 1 :]

    def _defang(self, message: dict[str, Any]) -> dict[str, Any]:
        content = message.get("content")
        if not isinstance(content, str) or message.get("role") == "system":
            return message
        for special in self._specials:
            if special in content:
                content = content.replace(special, special[0] + "\u200b" + special[1:])
        return {**message, "content": content}


@dataclass
class TokensClient:
    server: Server
    tokenizer: Any
    temperature: float = 1.0
    max_observation_tokens: int | None = None
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.server.model

    def session(self, transcript: Transcript) -> TokensSession:
        return TokensSession(self, transcript, TemplateRenderer(self.tokenizer, template_kwargs=self.template_kwargs))

    async def context_window(self, deadline: float | None = None) -> int | None:
        return await self.server.context_window(deadline)

    async def aclose(self) -> None:
        await self.server.aclose()


@dataclass
class TokensSession:
    client: TokensClient
    transcript: Transcript
    renderer: TemplateRenderer
    _segment: Segment | None = None
    _covered: int = 0  # messages the segment's ids cover, the last reply included
    _last: dict[str, Any] | None = None
    _closed: bool = True

    async def complete(
        self, messages: list[dict[str, Any]], *, tools: list[dict] | None, max_tokens: int, deadline: float
    ) -> Completion:
        if tools != self.renderer.tools:
            self.renderer = TemplateRenderer(
                self.client.tokenizer, tools=tools, template_kwargs=self.client.template_kwargs
            )
        segment, bridge = self._extend(messages)
        window = await self.client.context_window(deadline)
        budget = max_tokens if window is None else min(max_tokens, window - len(segment.ids))
        if budget < 1:
            raise ContextExceeded(f"the prompt has {len(segment.ids)} tokens: no room left in {window}")
        started = time.monotonic()
        body = {
            "model": self.client.model,
            "prompt": segment.ids,
            "max_tokens": budget,
            "temperature": self.client.temperature,
            "logprobs": 1,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "stop_token_ids": [self.renderer.close_id],
        }
        describe = f"{self.client.server.endpoint.base_url} completion"
        response = json_body(
            await call(post(self.client.server.sdk, "/completions", body), deadline, describe), describe
        )
        latency = time.monotonic() - started
        choices = response.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        ids = int_list(choice.get("token_ids"))
        if ids is None:
            raise ModelError("the completion has no token ids: the tokens client needs a server with return_token_ids")
        scores = choice.get("logprobs")
        raw_logprobs = (scores.get("token_logprobs") if isinstance(scores, dict) else None) or []
        logprobs = [float(x) if x is not None else 0.0 for x in raw_logprobs]
        if len(logprobs) != len(ids):
            raise ModelError(f"the completion has {len(ids)} token ids but {len(logprobs)} log-probs")
        prompt_ids = list(segment.ids)
        segment.ids += ids
        segment.mask += [1] * len(ids)
        segment.logprobs += logprobs
        self._closed = bool(ids) and ids[-1] == self.renderer.close_id
        completion = self._completion(ids, str(choice.get("finish_reason") or "stop"), tools is not None)
        completion.prompt_ids, completion.completion_ids, completion.logprobs = prompt_ids, ids, logprobs
        completion.prompt_tokens, completion.completion_tokens = len(prompt_ids), len(ids)
        completion.bridge, completion.latency = bridge, latency
        self._covered, self._last = len(messages) + 1, completion.message
        return completion

    def new_segment(self, reason: str) -> None:
        self._segment = self.transcript.new_segment(reason)
        self._covered, self._last, self._closed = 0, None, True

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int | None:
        if self._segment is None or not self._segment.ids:
            return None
        added = sum(len(self.renderer.encode(str(m.get("content") or ""))) for m in messages[self._covered :])
        return len(self._segment.ids) + added + 16 * max(1, len(messages) - self._covered)

    def cut_tokens(self, text: str) -> str:
        limit = self.client.max_observation_tokens
        if limit is None:
            return text
        decode = self.client.tokenizer.decode
        cut = cut_token_ids(self.renderer.encode(text), limit, decode)
        return text if cut is None else cut

    def _extend(self, messages: list[dict[str, Any]]) -> tuple[Segment, list[int] | None]:
        """The segment with ``messages`` rendered onto its ids, and the bridge (None: a full render)."""
        if self._segment is None:
            self._segment = self.transcript.segment
        segment = self._segment
        if segment.ids and self._last is not None:
            if len(messages) <= self._covered or messages[self._covered - 1] != self._last:
                raise ModelError("the history was rewritten without a new segment")
            bridge = self.renderer.bridge(self._last, messages[self._covered :])
            if bridge is not None:
                bridge = ([] if self._closed else [self.renderer.close_id]) + bridge
                segment.ids += bridge
                segment.mask += [0] * len(bridge)
                segment.logprobs += [0.0] * len(bridge)
                segment.bridges += 1
                return segment, bridge
            segment.bridge_breaks += 1
            self.transcript.notes.append(f"turn {len(self.transcript.turns)}: the chat template broke the prefix")
            segment = self._segment = self.transcript.new_segment("bridge_break")
        prompt = self.renderer.render(messages, add_generation_prompt=True)
        segment.ids, segment.mask, segment.logprobs = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
        return segment, None

    def _completion(self, ids: list[int], finish_reason: str, tool_format: bool) -> Completion:
        body = ids[:-1] if self._closed else ids
        text = self.client.tokenizer.decode(body, skip_special_tokens=False)
        reasoning = None
        thought = _THINK.match(text)
        if thought:
            reasoning, text = thought.group(1).strip(), text[thought.end() :]
        calls: list[ToolCall] = []
        content = text
        if tool_format:
            content, calls = parse_hermes(text)
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if calls:
            message["tool_calls"] = [
                {"id": c.id, "type": "function", "function": {"name": c.name or "", "arguments": _arguments(c)}}
                for c in calls
            ]
        return Completion(content, calls, finish_reason, message, reasoning=reasoning)


def _arguments(call: ToolCall) -> Any:
    """Arguments as chat templates expect them: a mapping when they parse, else the raw text."""
    import json

    try:
        value = json.loads(call.arguments)
    except json.JSONDecodeError:
        return call.arguments
    return value if isinstance(value, dict) else call.arguments
