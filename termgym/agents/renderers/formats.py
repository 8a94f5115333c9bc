"""The chat formats termgym renders itself, and the machinery their renderers share.

A ``FormatSpec`` names a format's structural tokens (each one id in every tokenizer of the format),
which of them are eos, pad and bos, which its real tokenizers leave unmarked as special, and its
chat template (``templates/*.jinja``, written by this project), which renders as text exactly what
the format's renderer renders as ids.

``FormatRenderer`` is the base of the format renderers (``chatml``, ``qwen-xml``, ``llama3``). It
guarantees, for every subclass:
* each text run is encoded on its own (``encode``), so no text, whatever it holds, becomes a
  structural id, and the ids of a run never depend on what is rendered around it;
* the generation prompt and the reply that follows it are separate runs, so a history turn renders
  to ``generation prompt + render_assistant(message)``;
* ``bridge`` is built from the new messages alone, and answers None exactly when the thinking
  retention renders some earlier turn differently than when it was first rendered or sampled
  (``_retention_breaks``): the segment then starts again from a full ``render``.

How text runs are encoded, and what each retention costs: docs/guides/training.md#renderers."""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from termgym.agents.renderers.base import THINKING_RETENTIONS, ParsedReply, ThinkingRetention
from termgym.errors import ConfigError, UnknownName


@dataclass(frozen=True)
class FormatSpec:
    """One chat format: its structural tokens (``special_tokens``, pad first: a tokenizer
    built for the format gives pad id 0), those a renderer cannot work without (``required``),
    those the format's real tokenizers do not mark special (``unmarked``), eos / pad / bos, the
    packaged template's file name, and the ``model_type`` values of config.json that mean it."""

    name: str
    special_tokens: tuple[str, ...]
    required: tuple[str, ...]
    unmarked: frozenset[str]
    eos: str
    pad: str
    bos: str | None
    template_file: str
    model_types: frozenset[str]

    @property
    def chat_template(self) -> str:
        """The format's chat template text (the packaged ``.jinja`` file)."""
        return _template_text(self.template_file)


QWEN_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
)
# Qwen2.5 has no <think> or <tool_response>: a ChatML renderer writes those as text there.
QWEN_UNMARKED = frozenset({"<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"})

FORMATS: dict[str, FormatSpec] = {
    "chatml": FormatSpec(
        name="chatml",
        special_tokens=QWEN_TOKENS,
        required=("<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"),
        unmarked=QWEN_UNMARKED,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        bos=None,
        template_file="chatml.jinja",
        model_types=frozenset({"qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next"}),
    ),
    "qwen-xml": FormatSpec(
        name="qwen-xml",
        special_tokens=QWEN_TOKENS,
        required=("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"),
        unmarked=QWEN_UNMARKED,
        eos="<|im_end|>",
        pad="<|endoftext|>",
        bos=None,
        template_file="qwen_xml.jinja",
        model_types=frozenset({"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"}),
    ),
    "llama3": FormatSpec(
        name="llama3",
        special_tokens=(
            "<|finetune_right_pad_id|>",
            "<|begin_of_text|>",
            "<|end_of_text|>",
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ),
        # Llama 3.0 has no <|eom_id|> or <|python_tag|> (reserved tokens sit at those ids)
        required=("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        unmarked=frozenset(),
        eos="<|eot_id|>",
        pad="<|finetune_right_pad_id|>",
        bos="<|begin_of_text|>",
        template_file="llama3.jinja",
        model_types=frozenset({"llama"}),
    ),
}
FORMAT_NAMES: tuple[str, ...] = tuple(FORMATS)


def format_spec(name: str) -> FormatSpec:
    """The chat format called ``name``; ``ConfigError`` naming the known ones otherwise."""
    spec = FORMATS.get(name)
    if spec is None:
        raise UnknownName("unknown chat format", name, FORMAT_NAMES)
    return spec


@cache
def _template_text(file_name: str) -> str:
    return (resources.files("termgym.agents.renderers") / "templates" / file_name).read_text(encoding="utf-8")


def check_thinking(thinking: str) -> ThinkingRetention:
    """``thinking`` as a retention; ``ConfigError`` naming the choices otherwise."""
    if thinking not in THINKING_RETENTIONS:
        raise UnknownName("unknown thinking retention", thinking, THINKING_RETENTIONS)
    return thinking  # pyright: ignore[reportReturnType]  # checked against the Literal's values above


def chat_template_text(tokenizer: Any) -> str:
    """The tokenizer's chat template ("" without one; every named template when it has several)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    return template if isinstance(template, str) else ""


# -- the parts of a render --------------------------------------------------------------------------

CUT = None  # a part that ends a text run: the generation prompt and the reply are separate runs
Part = int | str | None  # a structural id, text (encoded with special tokens split), or CUT


def message_text(message: dict[str, Any], key: str = "content") -> str:
    """A message's text field: a string, or "" for None; ``ValueError`` for anything else."""
    value = message.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"a {message.get('role')!r} message's {key} must be a string, not {type(value).__name__}")
    return value


def reasoning_of(message: dict[str, Any]) -> str | None:
    """The message's reasoning (``reasoning_content``), None when it has none."""
    value = message.get("reasoning_content")
    return value if isinstance(value, str) else None


def tool_calls_of(message: dict[str, Any]) -> list[tuple[str, Any]]:
    """The message's tool calls as (name, arguments) pairs, OpenAI's ``{"function": {...}}`` shape
    or a bare ``{"name", "arguments"}``; a missing name is ""."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise ValueError("an assistant message's tool_calls must be a list")
    pairs = []
    for call in calls:
        if not isinstance(call, dict):
            raise ValueError("each tool call must be a mapping")
        function = call.get("function", call)
        if not isinstance(function, dict):
            raise ValueError("a tool call's function must be a mapping")
        name = function.get("name")
        pairs.append((name if isinstance(name, str) else "", function.get("arguments", {})))
    return pairs


def last_user_index(messages: Sequence[dict[str, Any]]) -> int:
    return max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)


class TextEncoder:
    """Text to ids such that no text becomes a special, added or structural id: special tokens are
    split (``split_special_tokens``), and the text is cut after the first character of every
    spelling of an added token the tokenizer does not mark special (it would match those even
    with special tokens split) or of a structural token, each piece encoded on its own. The same
    text always gives the same ids."""

    def __init__(self, tokenizer: Any, structural: Iterable[str] = ()):
        self.tokenizer = tokenizer
        unmarked = {str(t) for t in tokenizer.added_tokens_decoder.values() if not t.special}
        spellings = sorted(unmarked | set(structural), key=len, reverse=True)
        self._spellings = re.compile("(?=(" + "|".join(map(re.escape, spellings)) + "))") if spellings else None

    def encode(self, text: str) -> list[int]:
        if not text:
            return []
        cuts = sorted({m.start() + 1 for m in self._spellings.finditer(text)}) if self._spellings else []
        ids: list[int] = []
        for start, end in zip([0, *cuts], [*cuts, len(text)]):
            ids += self.tokenizer(text[start:end], add_special_tokens=False, split_special_tokens=True).input_ids
        return ids


class FormatRenderer(ABC):
    """What the format renderers share: token lookups, encoding, retention, bridge (module docstring).

    Subclasses set ``name`` and ``spec`` and write ``_head`` (the opening: bos, the system message
    with its tools), ``_message`` (one message other than an assistant one), ``_generation_prompt``,
    ``_reply`` (an assistant message's parts after its generation prompt, close id included),
    ``_after_reply`` (what follows a reply's close before the next message), ``_retention_breaks``
    and ``parse``.
    """

    name: str
    spec: FormatSpec
    exact = True

    def __init__(self, tokenizer: Any, *, thinking: ThinkingRetention = "cycle"):
        self.tokenizer = tokenizer
        self.thinking: ThinkingRetention = check_thinking(thinking)
        vocab = tokenizer.get_vocab()
        missing = [t for t in self.spec.required if t not in vocab]
        if missing:
            raise ConfigError(
                f"the tokenizer lacks the {self.name} tokens {', '.join(missing)}: choose the renderer of its "
                "chat format, or --renderer template (the tokenizer's own chat template)"
            )
        self.ids: dict[str, int] = {t: vocab[t] for t in self.spec.special_tokens if t in vocab}
        self._encoder = TextEncoder(tokenizer, self.ids)

    # -- the Renderer protocol -------------------------------------------------------------------

    def render(
        self, messages: Sequence[dict[str, Any]], *, tools: list[dict] | None = None, add_generation_prompt: bool = True
    ) -> list[int]:
        messages = list(messages)
        kept = self._kept(messages)
        parts = self._head(messages, tools)
        for index, message in enumerate(messages):
            if index == 0 and message.get("role") == "system":
                continue  # the head renders it, with the tools
            parts += self._any_message(messages, index, kept[index])
        if add_generation_prompt:
            parts += self._generation_prompt(True)
        return self._encode_parts(parts)

    def bridge(
        self, history: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]], *, tools: list[dict] | None = None
    ) -> list[int] | None:
        history, new = list(history), list(new)
        if not history or history[-1].get("role") != "assistant":
            raise ValueError("a bridge follows a reply: history must end with an assistant message")
        if any(m.get("role") == "assistant" for m in new):
            return None
        before = self._kept(history)
        before[-1] = True  # the last reply was sampled after the generation prompt: its kept form
        after = self._kept([*history, *new])
        for index, message in enumerate(history):
            if message.get("role") == "assistant" and before[index] != after[index] and self._retention_breaks(message):
                return None
        everything = [*history, *new]
        parts = self._after_reply()
        for index in range(len(history), len(everything)):
            parts += self._any_message(everything, index, after[index])
        return self._encode_parts(parts + self._generation_prompt(True))

    def render_assistant(self, message: dict[str, Any]) -> list[int]:
        """The canonical ids of a reply: what follows the generation prompt, close id included
        (what a model trained on the format samples for ``message``)."""
        return self._encode_parts(self._reply(message, True))

    def encode(self, text: str) -> list[int]:
        return self._encoder.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        """Ids as text, special tokens spelled out, no clean-up of spaces."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    # -- shared pieces ---------------------------------------------------------------------------

    def _encode_parts(self, parts: Sequence[Part]) -> list[int]:
        ids: list[int] = []
        run: list[str] = []
        for part in [*parts, CUT]:
            if isinstance(part, str):
                run.append(part)
                continue
            if run:
                ids += self.encode("".join(run))
                run = []
            if isinstance(part, int):
                ids.append(part)
        return ids

    def _token(self, spelling: str) -> Part:
        """A structural token as its id, or as text where this tokenizer lacks it (Qwen2.5's
        ``<think>``): rendered the same, parsed as text."""
        return self.ids.get(spelling, spelling)

    def _framing(self, text: str) -> list[Part]:
        """Fixed template text with the format's token spellings in it as their ids."""
        spellings = sorted(self.ids, key=len, reverse=True)
        pieces = re.split("(" + "|".join(map(re.escape, spellings)) + ")", text)
        return [self.ids[p] if p in self.ids else p for p in pieces if p]

    def _kept(self, messages: Sequence[dict[str, Any]]) -> list[bool]:
        """Per message, whether the retention keeps its reasoning."""
        if self.thinking == "all":
            return [True] * len(messages)
        if self.thinking == "strip":
            return [False] * len(messages)
        last_user = last_user_index(messages)
        return [index > last_user for index in range(len(messages))]

    def _any_message(self, messages: list[dict[str, Any]], index: int, kept: bool) -> list[Part]:
        message = messages[index]
        if message.get("role") == "assistant":
            return [*self._generation_prompt(kept), CUT, *self._reply(message, kept), CUT, *self._after_reply()]
        return self._message(messages, index)

    def _decode_text(self, ids: Sequence[int]) -> str:
        return self.decode(ids) if ids else ""

    def _split_stop(self, ids: Sequence[int], stop_ids: Sequence[int]) -> tuple[list[int], bool]:
        """The reply's ids before its first stop id, and whether it had one."""
        ids = list(ids)
        for index, token in enumerate(ids):
            if token in stop_ids:
                return ids[:index], True
        return ids, False

    # -- per format ------------------------------------------------------------------------------

    @abstractmethod
    def parse(self, ids: Sequence[int]) -> ParsedReply: ...

    @abstractmethod
    def _head(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> list[Part]: ...

    @abstractmethod
    def _message(self, messages: list[dict[str, Any]], index: int) -> list[Part]: ...

    @abstractmethod
    def _generation_prompt(self, kept: bool) -> list[Part]: ...

    @abstractmethod
    def _reply(self, message: dict[str, Any], kept: bool) -> list[Part]: ...

    @abstractmethod
    def _after_reply(self) -> list[Part]: ...

    @abstractmethod
    def _retention_breaks(self, message: dict[str, Any]) -> bool:
        """Whether keeping or dropping this reply's reasoning renders it differently."""
