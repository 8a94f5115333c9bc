"""The model agent: one episode loop for every LLM, through a client seam (``termgym.agents.client``).

Per turn: ask the model (``Session.complete``), parse its reply in the action format
(``termgym.agents.actions``), run the command or submit, and show the model the observation
(``termgym.agents.prompts``). The same loop, prompt and parser serve evaluation and training.

Budgets, each ending the episode with a named stop reason (``termgym.transcript.StopReason``), a
Gymnasium truncation followed by verification: ``max_turns`` (every model reply counts, unparsable
ones too), ``agent_timeout`` (no request outlives the episode's agent time), ``parse_errors``
(``max_parse_errors`` unparsable replies in a row), ``context_exhausted`` (the next reply has no
room and the context policy cannot make any). A submit is the only termination. The reply's token
budget is ``max_tokens`` clamped to what remains of the context window.

Context policies (``none``, ``truncate``, ``summarize``): either rewrite of the history starts a new
segment, a new token sample. A model that cannot be reached past the client's retries raises
``ModelError``; the trial records ``model_error`` and the run goes on.
Details: docs/guides/agents.md#budgets-and-stop-reasons."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from termgym.agents.actions import (
    ACTION_FORMATS,
    TOOLS,
    ActionFormat,
    Command,
    ParseFailure,
    Submit,
    parse_text,
    parse_tool_calls,
)
from termgym.agents.client import Completion, ModelClient, Session
from termgym.agents.prompts import (
    ELIDED,
    SUMMARY_REQUEST,
    observation,
    resume_prompt,
    system_prompt,
    task_prompt,
)
from termgym.env import SUBMIT
from termgym.episode.options import EnvOptions
from termgym.errors import AgentDeadline, ConfigError, ContextExceeded, ModelError
from termgym.transcript import StopReason, Transcript
from termgym.trial import StepReturn

ContextPolicy = Literal["none", "truncate", "summarize"]
CONTEXT_POLICIES: tuple[ContextPolicy, ...] = ("none", "truncate", "summarize")
MIN_REPLY_TOKENS = 64  # below this many free tokens the context policy acts before the next request
KEEP_RECENT_OBSERVATIONS = 2


@dataclass(frozen=True)
class LoopSettings:
    """How the agent converses; the client holds where and how it reaches the model."""

    action_format: ActionFormat = "tool"
    max_tokens: int = 4096  # per reply, before the clamp to the context window
    max_parse_errors: int = 3  # consecutive
    context: ContextPolicy = "truncate"
    max_output_chars: int = 10_000  # per observation, head and tail
    summary_max_tokens: int = 1024
    system_prompt: str | None = None  # None: the action format's own

    def __post_init__(self) -> None:
        if self.action_format not in ACTION_FORMATS:
            raise ConfigError(f"action format must be one of {', '.join(ACTION_FORMATS)}, got {self.action_format!r}")
        if self.context not in CONTEXT_POLICIES:
            raise ConfigError(f"context policy must be one of {', '.join(CONTEXT_POLICIES)}, got {self.context!r}")
        for name in ("max_tokens", "max_parse_errors", "max_output_chars", "summary_max_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be at least 1, got {getattr(self, name)}")


class AgentEnv(Protocol):
    """What the model agent uses of an environment: ``AsyncTerminalEnv``, or a scripted stand-in."""

    options: EnvOptions
    transcript: Transcript

    @property
    def remaining_time(self) -> float: ...

    async def step(self, action: str, *, timeout: float | None = None) -> StepReturn: ...

    async def truncate(self, reason: StopReason) -> StepReturn: ...


@dataclass
class ReplyActor:
    """Acts on an episode's parsed replies, one at a time, as the model agent does; shared with the
    frameworks that hand termgym one reply per call (SkyRL's environment). A reply that did not
    parse is shown its error and counts towards ``max_parse_errors`` in a row, which end the
    episode (``parse_errors``); a submit ends it, or gives a multi-step task's next instruction; a
    command runs, and its observation is cut to ``max_output_chars`` (and ``cut_tokens``)."""

    env: AgentEnv
    max_parse_errors: int
    max_output_chars: int
    cut_tokens: Callable[[str], str] | None = None
    failures_in_a_row: int = 0

    async def act(self, action: Command | Submit | ParseFailure) -> tuple[StepReturn | None, str]:
        """(the final step, "") when the episode ended, else (None, what the model is shown next)."""
        transcript = self.env.transcript
        if isinstance(action, ParseFailure):
            self.failures_in_a_row += 1
            shown = f"Your reply was not an action: {action.message}"
            transcript.invalid(action.message, shown)
            if self.failures_in_a_row >= self.max_parse_errors:
                return await self.env.truncate("parse_errors"), ""
            return None, shown
        self.failures_in_a_row = 0
        if isinstance(action, Submit):
            step = await self.env.step(SUBMIT)
            if step[2] or step[3]:  # terminated or truncated
                return step, ""
            return None, step[0]  # a multi-step task's next step: its instruction (the env noted it)
        step = await self.env.step(action.command, timeout=action.timeout)
        _, _, terminated, truncated, info = step
        if terminated or truncated:
            return step, ""
        shown = observation(
            info["output"],
            info["exit_code"],
            info["timed_out"],
            max_chars=self.max_output_chars,
            cut_tokens=self.cut_tokens,
        )
        transcript.observed(shown)
        return None, shown


@dataclass
class ModelAgent:
    """Drives an ``AsyncTerminalEnv`` with a model. One agent serves many concurrent episodes (each
    has its own session); ``aclose`` closes the client's connections."""

    client: ModelClient
    settings: LoopSettings = field(default_factory=LoopSettings)
    name: str = "model"

    @property
    def model(self) -> str:
        return self.client.model

    async def aclose(self) -> None:
        await self.client.aclose()

    async def run(self, env: AgentEnv, instruction: str, info: dict) -> StepReturn | None:
        transcript = env.transcript
        transcript.model = self.client.model
        episode = _Episode(self, env, self.client.session(transcript), transcript, info.get("workdir"))
        try:
            return await episode.run(instruction)
        finally:
            transcript.segment.messages = episode.messages


@dataclass
class _Episode:
    agent: ModelAgent
    env: AgentEnv
    session: Session
    transcript: Transcript
    workdir: str | None
    messages: list[dict[str, Any]] = field(default_factory=list)
    replies: int = 0
    replies_at_summary: int = 0  # replies when the history was last summarized (or at the start)
    actor: ReplyActor = field(init=False)

    def __post_init__(self) -> None:
        settings = self.agent.settings
        self.actor = ReplyActor(self.env, settings.max_parse_errors, settings.max_output_chars, self.session.cut_tokens)

    @property
    def settings(self) -> LoopSettings:
        return self.agent.settings

    @property
    def tools(self) -> list[dict] | None:
        return TOOLS if self.settings.action_format == "tool" else None

    async def run(self, instruction: str) -> StepReturn:
        self.instruction = instruction
        self.messages = self._opening(task_prompt(instruction, self.workdir))
        window = await self.agent.client.context_window(time.monotonic() + self.env.remaining_time)
        while True:
            if self.replies >= self.env.options.max_turns:
                return await self.env.truncate("max_turns")
            try:
                completion = await self._ask(window)
                if completion is None and not await self._make_room():
                    return await self.env.truncate("context_exhausted")
            except AgentDeadline:
                return await self.env.truncate("agent_timeout")
            except ModelError:
                self.transcript.stop("model_error")
                raise
            if completion is None:
                continue
            self.replies += 1
            self.transcript.usage.add(completion.prompt_tokens, completion.completion_tokens)
            self.transcript.reply(completion.reply_record())
            self.messages.append(completion.message)
            step = await self._act(completion)
            if step is not None:
                return step

    async def _ask(self, window: int | None) -> Completion | None:
        """The next reply, its token budget clamped to the window; None when the prompt does not
        fit (the window is nearly full, or the server says so): the context policy acts then."""
        max_tokens = self.settings.max_tokens
        used = self.session.prompt_tokens(self.messages) if window is not None else None
        if window is not None:  # without an estimate, at least never more than the whole window
            if used is not None and window - used < min(MIN_REPLY_TOKENS, max_tokens):
                return None
            max_tokens = max(1, min(max_tokens, window - (used or 1)))
        deadline = time.monotonic() + self.env.remaining_time
        try:
            return await self.session.complete(
                self.messages, tools=self.tools, max_tokens=max_tokens, deadline=deadline
            )
        except ContextExceeded as exc:
            # The server says how long the prompt is: ask once more with the budget that fits.
            room = window - exc.prompt_tokens if window is not None and exc.prompt_tokens is not None else None
            if room is None or room >= max_tokens or room < min(MIN_REPLY_TOKENS, self.settings.max_tokens):
                return None
            try:
                return await self.session.complete(self.messages, tools=self.tools, max_tokens=room, deadline=deadline)
            except ContextExceeded:
                return None

    async def _act(self, completion: Completion) -> StepReturn | None:
        """Run what the reply asks for; the final step when the episode ended, else None."""
        if self.settings.action_format == "tool":
            action = parse_tool_calls(completion.tool_calls)
        else:
            action = parse_text(completion.content)
        ended, shown = await self.actor.act(action)
        if ended is None:
            self.messages += self._observation_messages(completion, shown)
        return ended

    def _observation_messages(self, completion: Completion, text: str) -> list[dict[str, Any]]:
        """Tool-role messages answering each tool call (tool format), else one user message."""
        calls = completion.message.get("tool_calls") or []
        if self.settings.action_format == "tool" and calls:
            return [{"role": "tool", "tool_call_id": call["id"], "content": text} for call in calls]
        return [{"role": "user", "content": text}]

    def _opening(self, user: str) -> list[dict[str, Any]]:
        system = self.settings.system_prompt or system_prompt(self.settings.action_format)
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    async def _make_room(self) -> bool:
        """Apply the context policy; False when nothing could be freed."""
        if self.settings.context == "summarize" and self.replies > self.replies_at_summary and await self._summarize():
            self.replies_at_summary = self.replies
            return True
        if self.settings.context in ("truncate", "summarize"):
            return self._elide()
        return False

    def _elide(self) -> bool:
        observations = [
            i
            for i, m in enumerate(self.messages)
            if i >= 2 and m["role"] in ("tool", "user") and m.get("content") != ELIDED
        ]
        if len(observations) <= KEEP_RECENT_OBSERVATIONS:
            return False
        self.transcript.segment.messages = [dict(m) for m in self.messages]
        for i in observations[: len(observations) - KEEP_RECENT_OBSERVATIONS]:
            self.messages[i] = {**self.messages[i], "content": ELIDED}
        self.session.new_segment("truncate")
        return True

    async def _summarize(self) -> bool:
        """Ask for a summary (the request is part of the current segment) and restart from it."""
        request = [*self.messages, {"role": "user", "content": SUMMARY_REQUEST}]
        deadline = time.monotonic() + self.env.remaining_time
        try:
            reply = await self.session.complete(  # the same tools: the rendered prompt stays a prefix
                request, tools=self.tools, max_tokens=self.settings.summary_max_tokens, deadline=deadline
            )
        except (ContextExceeded, ModelError):
            self.transcript.summaries_failed += 1
            return False
        self.transcript.usage.add(reply.prompt_tokens, reply.completion_tokens)
        summary = reply.content.strip()
        if not summary or reply.finish_reason == "length":
            self.transcript.summaries_failed += 1
            return False
        self.transcript.summaries += 1
        self.transcript.segment.messages = [*request, reply.message]
        self.session.new_segment("summary")
        self.messages = self._opening(resume_prompt(self.instruction, self.workdir, summary))
        return True
