"""The generic renderer: the tokenizer's own chat template, for a model whose family termgym does
not render itself (``--renderer template``).

``render`` applies the template (``apply_chat_template``, text) and encodes the text with the
tokenizer's added tokens matched, so the template's framing becomes its special ids. Content cannot
forge a turn: in every message except the system one, each spelling of a special or added token is
broken with a zero-width space after its first character before rendering.

``bridge(history, new)`` renders ``[anchor, last reply]`` and ``[anchor, last reply, *new]`` (the
anchor a one-character user message) and answers the ids after the last close id of the shorter
one, only when the shorter one is a token prefix of the longer and holds a close id: each bridge is
checked, none is assumed (``exact = False``). Templates that rewrite the last turn once another
follows (Qwen3's official one adds an empty think block to the last reply only) answer None, and
the session starts a new segment.

``parse`` can do no better than text: it decodes the reply, reads a leading ``<think>`` ...
``</think>`` as reasoning and Hermes ``<tool_call>`` blocks (``actions.parse_hermes``) as calls, so
a literal ``<tool_call>`` in the reply's text is read as a call. ``thinking`` is recorded and not
applied: the template's own rule decides what earlier reasoning the prompt keeps.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from termgym.agents.actions import parse_hermes
from termgym.agents.renderers.base import ParsedReply, ThinkingRetention
from termgym.agents.renderers.formats import TextEncoder, check_thinking
from termgym.errors import ConfigError

ANCHOR = {"role": "user", "content": "."}
_THINK = re.compile(r"^\s*<think>(.*?)(?:</think>\s*|$)", re.DOTALL)


class TemplateRenderer:
    """Messages to ids through the tokenizer's own chat template (module docstring)."""

    name = "template"
    exact = False

    def __init__(
        self, tokenizer: Any, *, thinking: ThinkingRetention = "cycle", template_kwargs: dict[str, Any] | None = None
    ):
        if not getattr(tokenizer, "chat_template", None):
            raise ConfigError("--renderer template needs a tokenizer with a chat template, and this one has none")
        if tokenizer.eos_token_id is None:
            raise ConfigError("--renderer template needs a tokenizer with an end-of-turn (eos) token")
        self.tokenizer = tokenizer
        self.thinking: ThinkingRetention = check_thinking(thinking)
        self.template_kwargs = dict(template_kwargs or {})
        self.close_id: int = tokenizer.eos_token_id
        self.stop_ids: tuple[int, ...] = (self.close_id,)
        specials = set(tokenizer.all_special_tokens) | {str(t) for t in tokenizer.added_tokens_decoder.values()}
        self._specials = sorted((s for s in specials if len(s) > 1), key=len, reverse=True)
        self._encoder = TextEncoder(tokenizer)

    def render(
        self, messages: Sequence[dict[str, Any]], *, tools: list[dict] | None = None, add_generation_prompt: bool = True
    ) -> list[int]:
        return self._ids(self._text(messages, tools, add_generation_prompt))

    def bridge(
        self, history: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]], *, tools: list[dict] | None = None
    ) -> list[int] | None:
        if not history or history[-1].get("role") != "assistant":
            raise ValueError("a bridge follows a reply: history must end with an assistant message")
        if any(m.get("role") == "assistant" for m in new):
            return None
        previous = history[-1]
        base = self.render([ANCHOR, previous], tools=tools, add_generation_prompt=False)
        full = self.render([ANCHOR, previous, *new], tools=tools, add_generation_prompt=True)
        if full[: len(base)] != base or self.close_id not in base:
            return None
        cut = len(base) - 1 - base[::-1].index(self.close_id)
        return full[cut + 1 :]

    def render_assistant(self, message: dict[str, Any]) -> list[int]:
        """The reply as the template writes it after its generation prompt, encoded on its own (as a
        model samples it after the prompt), through its last close id; ``ValueError`` when the
        template does not extend its own prompt."""
        prompt = self._text([ANCHOR], None, True)
        whole = self._text([ANCHOR, message], None, False)
        reply = self._ids(whole[len(prompt) :]) if whole.startswith(prompt) else []
        if self.close_id not in reply:
            raise ValueError("the chat template does not write a reply after its own generation prompt")
        return reply[: len(reply) - reply[::-1].index(self.close_id)]

    def parse(self, ids: Sequence[int]) -> ParsedReply:
        ids = list(ids)
        closed = bool(ids) and ids[-1] in self.stop_ids
        text = self.tokenizer.decode(ids[:-1] if closed else ids, skip_special_tokens=False)
        reasoning = None
        thought = _THINK.match(text)
        if thought:
            reasoning, text = thought.group(1).strip(), text[thought.end() :]
        content, calls = parse_hermes(text)
        return ParsedReply(content, reasoning, calls, closed)

    def encode(self, text: str) -> list[int]:
        return self._encoder.encode(text)

    def _text(self, messages: Sequence[dict[str, Any]], tools: list[dict] | None, generation: bool) -> str:
        return self.tokenizer.apply_chat_template(
            [self._defang(m) for m in messages],
            tools=tools,
            add_generation_prompt=generation,
            tokenize=False,
            **self.template_kwargs,
        )

    def _ids(self, text: str) -> list[int]:
        """Template text as ids, its framing's added tokens matched."""
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def _defang(self, message: dict[str, Any]) -> dict[str, Any]:
        """The message with every special spelling in its content, reasoning and tool-call
        arguments broken (a system message is the project's own and is left as it is)."""
        if message.get("role") == "system":
            return message
        defanged = {**message}
        for key in ("content", "reasoning_content"):
            if isinstance(message.get(key), str):
                defanged[key] = self._break(message[key])
        if isinstance(message.get("tool_calls"), list):
            defanged["tool_calls"] = [self._break(call) for call in message["tool_calls"]]
        return defanged

    def _break(self, value: Any) -> Any:
        if isinstance(value, str):
            for special in self._specials:
                if special in value:
                    value = value.replace(special, special[0] + "\u200b" + special[1:])
            return value
        if isinstance(value, dict):
            return {k: self._break(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._break(v) for v in value]
        return value
