"""The trainer's samplers as the model agent's client: rollouts, evaluation and the supervised warm
start's demonstrations all run the model agent's episode loop (``termgym.agents.model``), rendered
token-exactly by the policy's renderer (``termgym.agents.tokens.RenderedSession``).

``PolicyClient`` serves one episode: its session samples each reply with a ``Sampler``
(``trainer/sampler.py``: the torch sampler with its key/value cache, the in-process vLLM engine, a
``vllm serve`` through ``trainer/server_sampler.py``) and keeps what training needs beside the
transcript: each turn's sampled ids where they landed, and the routing (R3) the sampler recorded.
``TeacherClient`` replies with given actions instead of sampling (the reference solution, as
canonical ids of the renderer), so a demonstration is the token sequence a policy that typed those
commands would have produced: the same prompt, framing and observations as a rollout.

Routing (R3), per segment: a sampled position ``p`` gets the experts of the sampler forward that
first read ``ids[p]`` as input (the forward that sampled ``p + 1``, or for a turn's last token the
next turn's first forward); positions no forward read (prompt, bridges, each segment's last sampled
token) stay unrecorded (``-1``) and route freely in training.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from termgym.agents.renderers import Renderer
from termgym.agents.tokens import Generated, RenderedSession
from termgym.errors import AgentDeadline
from termgym.transcript import Segment, Transcript

from .sampler import Sampler


@dataclass(frozen=True)
class TurnLog:
    """Where one turn's sampled ids landed: its segment and start position, and the ids exactly as
    the sampler returned them (what token drift compares against)."""

    segment: int
    start: int
    sampled: list[int]


@dataclass
class SamplerBackend:
    """``Backend`` of a ``RenderedSession`` over a ``Sampler``; ``generator`` None samples greedily."""

    sampler: Sampler
    generator: torch.Generator | None
    turns: list[TurnLog] = field(default_factory=list)
    routing: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)  # segment -> position -> experts
    _unread: dict[int, list[int]] = field(default_factory=dict)  # segment -> sampled positions no forward read

    async def generate(
        self, segment: Segment, max_tokens: int, stop_ids: tuple[int, ...], deadline: float
    ) -> Generated:
        recording = self.sampler.records_routing
        positions = self._unread.get(segment.index, []) if recording else []
        start = len(segment.ids)
        try:  # a timeout, not wait_for: no task of its own, so the sampler batches the request as before
            async with asyncio.timeout(max(deadline - time.monotonic(), 1e-3)):
                turn = await self.sampler.generate_turn(
                    list(segment.ids), max_tokens, stop_ids, self.generator, positions
                )
        except TimeoutError:
            raise AgentDeadline("the episode's agent time ran out while the policy sampled") from None
        tokens = list(turn.tokens)
        if recording and tokens:
            self.routing.setdefault(segment.index, {}).update(turn.routing or {})
            self._unread[segment.index] = [start + len(tokens) - 1]
        self.turns.append(TurnLog(segment.index, start, tokens))
        finish = "stop" if tokens and tokens[-1] in stop_ids else "length"
        return Generated(tokens, list(turn.logprobs), finish)


@dataclass
class PolicyClient:
    """``ModelClient`` of one episode of the policy. ``context_length``: tokens per segment."""

    sampler: Sampler
    renderer: Renderer
    generator: torch.Generator | None
    context_length: int
    max_observation_tokens: int | None = None
    model: str = "policy"
    backend: SamplerBackend | None = None
    sessions: list[RenderedSession] = field(default_factory=list)

    def session(self, transcript: Transcript) -> RenderedSession:
        self.backend = SamplerBackend(self.sampler, self.generator)
        session = RenderedSession(
            transcript, self.renderer, self.backend, self.context_window, self.max_observation_tokens
        )
        self.sessions.append(session)
        return session

    async def context_window(self, deadline: float | None = None) -> int | None:
        return self.context_length

    async def aclose(self) -> None:
        """Nothing to close: the sampler outlives its episodes."""

    def release(self, transcript: Transcript) -> None:
        """The episode has ended: the sampler may drop what it kept for each segment's ids."""
        for segment in transcript.segments:
            if segment.ids:
                self.sampler.forget(segment.ids)


@dataclass
class TeacherBackend:
    """Replies with ``replies`` (canonical ids, close id included), one per request, in order;
    ``overlong`` counts replies longer than the budget asked for (cut there, as a sampler would)."""

    replies: list[list[int]]
    overlong: list[int] = field(default_factory=list)  # the full length of each reply that was cut

    async def generate(
        self, segment: Segment, max_tokens: int, stop_ids: tuple[int, ...], deadline: float
    ) -> Generated:
        ids = list(self.replies.pop(0)) if self.replies else []
        if len(ids) > max_tokens:
            self.overlong.append(len(ids))
            ids = ids[:max_tokens]
        finish = "stop" if ids and ids[-1] in stop_ids else "length"
        return Generated(ids, [0.0] * len(ids), finish)


@dataclass
class TeacherClient:
    """``ModelClient`` of one demonstration: ``replies`` are the canonical ids of each reply."""

    renderer: Renderer
    replies: Sequence[list[int]]
    context_length: int
    max_observation_tokens: int | None = None
    model: str = "reference"
    backend: TeacherBackend | None = None

    def session(self, transcript: Transcript) -> RenderedSession:
        self.backend = TeacherBackend([list(r) for r in self.replies])
        return RenderedSession(
            transcript, self.renderer, self.backend, self.context_window, self.max_observation_tokens
        )

    async def context_window(self, deadline: float | None = None) -> int | None:
        return self.context_length

    async def aclose(self) -> None:
        """Nothing to close."""
