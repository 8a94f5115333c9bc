"""The renderer seam: a conversation to token ids, a completion's ids back to a reply, and the bridge
between turns that keeps an episode token-exact (TITO).

A renderer is the one place that knows a model family's chat format. Per segment, the sampling
session (``termgym.agents.tokens.RenderedSession``) keeps
``ids = render(opening) + sampled_1 + bridge_1 + sampled_2 + ...``, where each ``sampled_t`` is
exactly what the model produced (through its close token) and ``bridge(history_t, new_t)`` is the
only text tokenized after the first prompt. ``bridge`` answers None when the prefix cannot be kept;
the session then starts a new segment from a full ``render``.

Guaranteed by every renderer: text from messages is encoded with special tokens split, so no
content ever becomes a special id; ``parse`` reads structure on special-token ids where the family
has them, never on text, and never raises; ``close_id`` is in ``stop_ids`` (a reply cut short is
closed with it, outside the loss). Family renderers (``exact = True``) render ``history + new`` to
the segment's ids whenever each assistant message renders to the ids sampled for it; the generic
``TemplateRenderer`` (``exact = False``) proves each bridge by rendering twice and reports breaks.

More: docs/guides/training.md#renderers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from termgym.agents.actions import ToolCall

# How much of earlier replies' reasoning the prompt keeps (docs/guides/training.md#thinking-retention has the costs):
# all: every reply keeps its reasoning (the prefix always holds; prompts are longest);
# cycle: reasoning is kept for replies after the last user message (Qwen3's own rule: tool results
# do not end the cycle, a user turn does, and then earlier reasoning is dropped: a new segment);
# strip: no earlier reply keeps its reasoning (every reply with reasoning breaks the prefix).
ThinkingRetention = Literal["all", "cycle", "strip"]
THINKING_RETENTIONS: tuple[ThinkingRetention, ...] = ("all", "cycle", "strip")


@dataclass(frozen=True)
class ParsedReply:
    """A completion read back: ``content`` without reasoning or tool calls, ``reasoning`` (None: no
    reasoning block), the tool calls in order, and whether it ended with a stop id."""

    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    closed: bool = True


class Renderer(Protocol):
    name: str  # the family's name: chatml, qwen-xml, llama3, template
    tokenizer: Any
    close_id: int  # ends an assistant turn; synthesized (outside the loss) after a reply cut short
    stop_ids: tuple[int, ...]  # ids that end sampling, close_id among them
    exact: bool  # True: bridges hold by construction; False: each bridge is checked by rendering twice
    thinking: ThinkingRetention

    def render(
        self, messages: Sequence[dict[str, Any]], *, tools: list[dict] | None = None, add_generation_prompt: bool = True
    ) -> list[int]:
        """The whole conversation as ids, ending with the assistant's generation prompt when asked."""
        ...

    def bridge(
        self, history: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]], *, tools: list[dict] | None = None
    ) -> list[int] | None:
        """The ids after the last reply of ``history`` (its last message, an assistant message, whose
        sampled ids end at its close token) through the generation prompt that follows ``new``
        (tool or user messages, never assistant ones); None when the prefix cannot be kept."""
        ...

    def render_assistant(self, message: dict[str, Any]) -> list[int]:
        """The canonical ids of a reply (what follows the generation prompt, close id included):
        what a model trained on the format samples for ``message``."""
        ...

    def parse(self, ids: Sequence[int]) -> ParsedReply:
        """A completion's ids (as sampled, stop id included if there) as content, reasoning and calls."""
        ...

    def encode(self, text: str) -> list[int]:
        """Plain text as ids, special tokens split (no text becomes a special id)."""
        ...
