"""An unchanged agent harness as a termgym agent: the harness runs its own loop in a thread of its
own, reaches its model through a session of the recording gateway (``termgym.gateway``) and the
trial's sandbox through ``EnvBridge``; termgym verifies when it ends, as for any agent.

``HarnessAgent`` implements termgym's ``Agent``: per trial it opens a gateway session bounded by
the episode's agent time, runs ``harness.run(base_url, bridge, instruction, info)`` in a thread,
and when that returns, raises or is cancelled, closes the session and records the harness's own
account (``harness``) and every gateway call (``calls``) in the transcript. A harness that did not
submit ends as ``agent_timeout``, ``model_error``, ``max_turns``, ``parse_errors``,
``context_exhausted`` or ``harness_exit``, each verified.

Guaranteed: no trial outlives its agent time by more than ``DEADLINE_GRACE`` plus ``JOIN_GRACE``:
at the deadline (or on cancellation) the session and the bridge end, so the harness's next call or
command stops it, and its thread is waited for; a harness that neither calls nor acts by then is
left to end on its own (a daemon thread holding no session and no sandbox) and recorded as
``Unresponsive``. The bridge refuses every command once the episode is over.

Which harness outcome maps to which stop reason: docs/guides/harnesses.md#mini-swe-agent-as-a-termgym-agent."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.errors import ModelError
from termgym.gateway import Gateway, GatewaySession, Upstream
from termgym.transcript import StopReason
from termgym.trial import StepReturn

JOIN_GRACE = 90.0  # seconds a harness may take to notice its session ended (a retry's sleep is at most 60)
DEADLINE_GRACE = 10.0  # past the agent time, seconds before a harness that neither calls nor acts is stopped


class HarnessStopped(Exception):
    """The episode is over (or the trial was cancelled): the harness must stop."""


@dataclass
class HarnessResult:
    """How the harness's own loop ended: its exit status (``Submitted``, ``LimitsExceeded``, an
    exception's type name...), a one-line error when it raised, and its messages (JSON)."""

    exit_status: str
    error: str | None = None
    messages: list[Any] = field(default_factory=list)
    context_error: bool = False  # the harness stopped on a context-window error


class Harness(Protocol):
    """An agent harness run in a thread: it drives ``bridge`` with a model at ``base_url``.
    ``submit_command``: the command by which it submits (a scripted teacher types it last)."""

    name: str
    submit_command: str

    def run(self, base_url: str, model: str, bridge: EnvBridge, instruction: str, info: dict) -> HarnessResult: ...


class EnvBridge:
    """The trial's environment as a harness thread uses it (blocking calls, run on the trial's loop)."""

    def __init__(self, env: AsyncTerminalEnv, loop: asyncio.AbstractEventLoop, info: dict) -> None:
        self.env, self.loop, self.info = env, loop, info
        self.last: StepReturn | None = None
        self.closed = False

    @property
    def done(self) -> bool:
        return self.closed or self.env.done

    def step(self, command: str, timeout: float | None = None) -> StepReturn:
        """Run ``command`` in the sandbox; ``HarnessStopped`` once the episode is over."""
        return self._call(lambda: self.env.step(command, timeout=timeout))

    def submit(self) -> StepReturn:
        """Submit (verify, or hand over a multi-step task's next step)."""
        return self._call(lambda: self.env.step(SUBMIT))

    def _call(self, make: Callable[[], Any]) -> StepReturn:
        if self.done:
            raise HarnessStopped("the episode is over")
        future = asyncio.run_coroutine_threadsafe(self._guarded(make), self.loop)
        step = future.result()
        self.last = step
        return step

    async def _guarded(self, make: Callable[[], Any]) -> StepReturn:
        if self.done:  # re-checked on the loop: the trial may have ended meanwhile
            raise HarnessStopped("the episode is over")
        return await make()


UpstreamFactory = Callable[[AsyncTerminalEnv], Upstream]


def client_upstream(client: Any, max_tokens: int) -> UpstreamFactory:
    """The upstream factory of a termgym ``ModelClient`` in this process (the trainer's samplers,
    the scripted teacher, the tokens client): each trial's gateway session is one of its sessions
    (``SessionUpstream``), writing the token segments into the trial's transcript."""
    from termgym.gateway import SessionUpstream

    def make(env: AsyncTerminalEnv) -> Upstream:
        return SessionUpstream(client.session(env.transcript), env.transcript, client.model, max_tokens)

    return make


@dataclass
class Forwarding:
    """The upstream factory of a server over HTTP: every trial's session forwards to ``base_url``
    through one shared connection pool (made on first use, closed by ``aclose``), with the run's
    ``forced`` request fields."""

    base_url: str
    api_key: str | None = None
    forced: dict[str, Any] = field(default_factory=dict)
    _http: Any = None
    _dropped: set[str] = field(default_factory=set)

    def __call__(self, env: AsyncTerminalEnv | None = None) -> Upstream:
        from termgym.gateway import ForwardUpstream

        if self._http is None:
            import aiohttp

            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000, force_close=False))
        return ForwardUpstream(self.base_url, self._http, self.api_key, dict(self.forced), self._dropped)

    async def aclose(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.close()


@dataclass
class HarnessAgent:
    """termgym's ``Agent`` around a harness (module docstring). The gateway is shared by the
    agent's trials, started on the first and closed by ``aclose``."""

    harness: Harness
    upstream: UpstreamFactory
    model: str
    name: str = ""
    gateway: Gateway | None = None
    _starting: asyncio.Lock = field(default_factory=asyncio.Lock)

    def __post_init__(self) -> None:
        self.name = self.name or self.harness.name

    async def started_gateway(self) -> Gateway:
        async with self._starting:
            if self.gateway is None:
                self.gateway = await Gateway().start()
            return self.gateway

    async def aclose(self) -> None:
        gateway, self.gateway = self.gateway, None
        if gateway is not None:
            await gateway.aclose()
        close = getattr(self.upstream, "aclose", None)
        if close is not None:
            await close()

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> StepReturn | None:
        gateway = await self.started_gateway()
        transcript = env.transcript
        transcript.model = self.model
        session_id = uuid.uuid4().hex[:16]
        deadline = time.monotonic() + env.remaining_time
        session = gateway.open(
            session_id, self.upstream(env), model=self.model, deadline=deadline, transcript=transcript
        )
        bridge = EnvBridge(env, asyncio.get_running_loop(), info)

        def stop(reason: str) -> None:
            bridge.closed = True
            if session_id in gateway.sessions:
                gateway.close(session_id, reason)

        result: HarnessResult | None = None
        try:
            result = await _in_thread(
                lambda: self.harness.run(gateway.base_url(session_id), self.model, bridge, instruction, info),
                limit=env.remaining_time + DEADLINE_GRACE,
                stop=stop,
                name=f"harness-{session_id}",
            )
        finally:
            stop("trial_ended")
            _record(transcript, self.harness.name, session, result)
        if env.done:
            return bridge.last
        return await env.truncate(_stop_reason(session, result))


async def _in_thread(
    work: Callable[[], HarnessResult], *, limit: float, stop: Callable[[str], None], name: str
) -> HarnessResult:
    """``work()`` in a thread of its own, waited for up to ``limit`` seconds. Past the limit,
    ``stop("deadline")`` tells the harness to stop (its next model call or command ends it) and the
    thread gets ``JOIN_GRACE`` more; a harness that still runs then is left to end on its own (a
    daemon thread, with no session and no sandbox left to it) and the result says so. When the
    caller is cancelled: ``stop("cancelled")``, the same wait, then the cancellation propagates."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[HarnessResult] = loop.create_future()

    def settle(outcome: HarnessResult | BaseException) -> None:
        if done.done():
            return
        if isinstance(outcome, BaseException):
            done.set_exception(outcome)
        else:
            done.set_result(outcome)

    def target() -> None:
        try:
            outcome: HarnessResult | BaseException = work()
        except BaseException as exc:
            outcome = exc
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, outcome)

    threading.Thread(target=target, name=name, daemon=True).start()
    try:
        await asyncio.wait({done}, timeout=max(0.0, limit))
    except asyncio.CancelledError:
        stop("cancelled")
        await asyncio.wait({done}, timeout=JOIN_GRACE)
        if done.done():
            done.exception()  # retrieved
        raise
    if not done.done():
        stop("deadline")
        await asyncio.wait({done}, timeout=JOIN_GRACE)
        if not done.done():
            done.cancel()
            return HarnessResult(
                "Unresponsive", error=f"the harness did not stop within {JOIN_GRACE:g} s of its deadline"
            )
    return done.result()


def _record(transcript: Any, name: str, session: GatewaySession, result: HarnessResult | None) -> None:
    transcript.calls = [call.to_dict() for call in session.calls]
    transcript.harness = {
        "name": name,
        "exit_status": result.exit_status if result else "cancelled",
        "error": result.error if result else None,
        "messages": json.loads(json.dumps(result.messages, default=str)) if result else [],
        "gateway_end": session.end_reason,
    }
    if not session.upstream.records_segments:
        merged = session.merged()
        transcript.segments = merged.segments
        if merged.untracked:
            transcript.notes.append(f"{merged.untracked} call(s) came back without token ids")
        if merged.without_logprobs:
            transcript.notes.append(f"{merged.without_logprobs} call(s) came back without log-probs")


def _stop_reason(session: GatewaySession, result: HarnessResult | None) -> StopReason:
    """Why the episode ended, when the harness stopped without the episode ending (module docstring)."""
    if session.end_reason == "deadline":
        return "agent_timeout"
    status = result.exit_status if result else ""
    answered = [call for call in session.calls if call.status]
    if result is not None and result.error is not None and answered and answered[-1].status >= 500:
        raise ModelError(f"the harness stopped after a failed model call: {answered[-1].error or result.error}")
    if result is not None and result.context_error:
        return "context_exhausted"
    if status in ("LimitsExceeded", "TimeExceeded"):
        return "agent_timeout" if status == "TimeExceeded" else "max_turns"
    if status == "RepeatedFormatError":
        return "parse_errors"
    return "harness_exit"
