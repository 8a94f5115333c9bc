"""The model agent's client seam: what the episode loop (``termgym.agents.model``) asks of a model,
and the reply every client gives back.

A ``ModelClient`` opens one ``Session`` per episode; ``Session.complete(messages, ...)`` answers a
``Completion``: the reply's text, reasoning and tool calls, the assistant message to append to the
history, usage, and (when the backend returns them) the prompt ids, the completion ids and the
per-token log-probs. The clients: the chat client (``termgym.agents.chat``: the server renders the
chat template), the tokens client (``termgym.agents.tokens``: termgym renders, token-exact), and
the trainer's samplers (``termgym.trainer.policy_client``). The remote ones reach their server
through ``termgym.agents.transport``.

What a session promises the loop: a reply by the request's deadline, else ``AgentDeadline``; a
prompt that does not fit the context window is ``ContextExceeded``; any other failure that is
left after the client's retries is a ``ModelError`` (``termgym.errors``). This module does no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from termgym.agents.actions import ToolCall
from termgym.transcript import Transcript


@dataclass
class Completion:
    content: str
    tool_calls: list[ToolCall]
    finish_reason: str
    message: dict[str, Any]  # the assistant message, as the history carries it
    reasoning: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    prompt_ids: list[int] | None = None
    completion_ids: list[int] | None = None
    logprobs: list[float] | None = None
    latency: float = 0.0
    bridge: list[int] | None = None  # tokens client: the ids rendered between the last turn and this prompt

    def reply_record(self) -> dict[str, Any]:
        """The transcript's ``reply`` entry."""
        tokens = None
        if self.completion_ids is not None:
            tokens = {
                "prompt_ids": self.prompt_ids if self.bridge is None else None,
                "bridge_ids": self.bridge,
                "completion_ids": self.completion_ids,
                "logprobs": self.logprobs,
            }
        return {
            "content": self.content,
            "reasoning": self.reasoning,
            "tool_calls": [{"id": c.id, "name": c.name, "arguments": c.arguments} for c in self.tool_calls],
            "finish_reason": self.finish_reason,
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens},
            "tokens": tokens,
            "latency": round(self.latency, 4),
        }


class Session(Protocol):
    """One episode's conversation with the model."""

    async def complete(
        self, messages: list[dict[str, Any]], *, tools: list[dict] | None, max_tokens: int, deadline: float
    ) -> Completion:
        """The model's next reply to ``messages``. ``deadline``: ``time.monotonic()`` by which the
        request must be answered (``AgentDeadline`` after it)."""
        ...

    def new_segment(self, reason: str) -> None:
        """The history was rewritten (a summary, elided observations): the next prompt starts a new
        token sample."""
        ...

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int | None:
        """The next prompt's length in tokens if known exactly or closely, else None."""
        ...

    def cut_tokens(self, text: str) -> str:
        """``text`` cut head and tail to the observation token limit (unchanged without a tokenizer)."""
        ...


class ModelClient(Protocol):
    model: str

    def session(self, transcript: Transcript) -> Session: ...

    async def context_window(self, deadline: float | None = None) -> int | None:
        """The model's context length in tokens, if known (settings, or the server's ``/models``)."""
        ...

    async def aclose(self) -> None: ...
