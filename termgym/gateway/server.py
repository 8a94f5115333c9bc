"""The recording model gateway: an OpenAI-compatible HTTP server on 127.0.0.1 that a harness uses
as its base URL, one session per trial, every call recorded (``termgym.gateway.calls``).

A session's base URL is ``http://127.0.0.1:PORT/sessions/<id>/v1`` (or ``/v1`` with the header
``X-Termgym-Session: <id>``): ``POST /chat/completions``, ``POST /completions``, ``GET /models``;
``GET /sessions/<id>/calls`` answers the session's calls and token samples as JSON.

Guaranteed:
* a request never outlives its session's deadline (the trial's agent time): past it, or once the
  session is closed, a call is answered at once with a 404 (``session_ended``, or
  ``session_not_found`` once ``close`` has forgotten it), which harnesses treat as final;
* an unknown session is a 404 ``session_not_found`` (unless the gateway opens sessions on demand,
  as ``termgym gateway`` does); a body that is not a JSON object is a 400; ``"stream": true`` is a
  400 (the gateway records whole answers);
* every call that reached a session is recorded, failed ones included, in arrival order, with the
  status the harness got;
* ``aclose`` ends every session and stops listening; nothing is left running.

In full: docs/guides/harnesses.md#the-gateway."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from termgym.agents.chat import parse_chat_response
from termgym.aio import cancel_and_wait
from termgym.errors import AgentDeadline, ModelError
from termgym.gateway.calls import CHAT_PATH, COMPLETIONS_PATH, Call, Merged, merge_calls, token_fields
from termgym.gateway.shapes import error_body
from termgym.gateway.upstreams import Answer, Upstream
from termgym.transcript import Transcript

SESSION_HEADER = "X-Termgym-Session"
MAX_BODY = 64 << 20  # a long agent history is megabytes of JSON


@dataclass
class GatewaySession:
    """One trial's calls. ``deadline``: ``time.monotonic()`` after which no call is served;
    ``transcript``: the trial's, given each chat reply and its usage as the model agent's are."""

    id: str
    upstream: Upstream
    model: str | None = None
    deadline: float | None = None
    transcript: Transcript | None = None
    calls: list[Call] = field(default_factory=list)
    opened: float = field(default_factory=time.monotonic)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    end_reason: str | None = None

    def end(self, reason: str) -> None:
        if self.end_reason is None:
            self.end_reason = reason
        self.ended.set()

    def merged(self) -> Merged:
        return merge_calls(self.calls)

    def to_dict(self) -> dict[str, Any]:
        merged = self.merged()
        return {
            "session": self.id,
            "calls": [call.to_dict() for call in self.calls],
            "samples": [
                {"ids": s.ids, "mask": s.mask, "logprobs": s.logprobs, "bridges": s.bridges, "reason": s.reason}
                for s in merged.segments
            ],
            "breaks": merged.breaks,
            "untracked": merged.untracked,
            "end_reason": self.end_reason,
        }


class Gateway:
    """The gateway (module docstring). ``on_demand(id)``, when given, makes the upstream of a session
    the first call names (``termgym gateway``); otherwise sessions are ``open``\\ ed by the runner."""

    def __init__(
        self, *, host: str = "127.0.0.1", port: int = 0, on_demand: Callable[[str], Upstream] | None = None
    ) -> None:
        self.host, self.port = host, port
        self.on_demand = on_demand
        self.sessions: dict[str, GatewaySession] = {}
        self._runner: Any = None

    # -- lifetime ------------------------------------------------------------------------------

    async def start(self) -> Gateway:
        from aiohttp import web

        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/sessions/{sid}/v1/chat/completions", self._chat)
        app.router.add_post("/sessions/{sid}/v1/completions", self._completions)
        app.router.add_get("/sessions/{sid}/v1/models", self._models)
        app.router.add_get("/sessions/{sid}/calls", self._calls)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._health)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port, reuse_address=True)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]
        return self

    async def aclose(self) -> None:
        for session in list(self.sessions.values()):
            session.end("gateway_closed")
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> Gateway:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def base_url(self, session_id: str) -> str:
        """The OpenAI base URL of a session: what the harness is given."""
        return f"{self.url}/sessions/{session_id}/v1"

    # -- sessions ------------------------------------------------------------------------------

    def open(
        self,
        session_id: str,
        upstream: Upstream,
        *,
        model: str | None = None,
        deadline: float | None = None,
        transcript: Transcript | None = None,
    ) -> GatewaySession:
        if session_id in self.sessions:
            raise ValueError(f"the gateway session {session_id!r} is already open")
        session = GatewaySession(session_id, upstream, model, deadline, transcript)
        self.sessions[session_id] = session
        return session

    def close(self, session_id: str, reason: str = "closed") -> GatewaySession:
        """End the session (its waiting calls are answered 404 at once) and forget it."""
        session = self.sessions.pop(session_id)
        session.end(reason)
        return session

    # -- handlers ------------------------------------------------------------------------------

    def _session(self, request: Any) -> GatewaySession | None:
        sid = request.match_info.get("sid") or request.headers.get(SESSION_HEADER)
        if not sid:
            return None
        session = self.sessions.get(sid)
        if session is None and self.on_demand is not None:
            session = self.open(sid, self.on_demand(sid))
        return session

    async def _chat(self, request: Any) -> Any:
        return await self._generate(request, CHAT_PATH)

    async def _completions(self, request: Any) -> Any:
        return await self._generate(request, COMPLETIONS_PATH)

    async def _generate(self, request: Any, path: str) -> Any:
        arrived = time.monotonic()
        session = self._session(request)
        if session is None:
            sid = request.match_info.get("sid") or request.headers.get(SESSION_HEADER)
            said = (
                f"no open termgym session {sid!r}" if sid else f"no session: use /sessions/<id>/v1 or {SESSION_HEADER}"
            )
            return _reply(Answer.failure(404, said, "session_not_found"))
        try:
            body = json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict):
            return _reply(Answer.failure(400, "the request body is not a JSON object", "invalid_request_error"))
        call = Call(len(session.calls), path, body, started=arrived - session.opened)
        session.calls.append(call)
        answer = await self._answer(session, path, body)
        call.request = answer.sent if answer.sent is not None else body
        call.status, call.error, call.notes = answer.status, answer.error, answer.notes
        call.latency = time.monotonic() - arrived
        if answer.data is not None:
            call.response = answer.data
            call.usage = answer.data.get("usage") if isinstance(answer.data.get("usage"), dict) else None
            if answer.status == 200:
                call.prompt_ids, call.completion_ids, call.logprobs = token_fields(path, answer.data)
                _tell_transcript(session, path, answer)
        return _reply(answer)

    async def _answer(self, session: GatewaySession, path: str, body: dict[str, Any]) -> Answer:
        if body.get("stream"):
            return Answer.failure(
                400, "the termgym gateway does not stream: send stream=false", "invalid_request_error"
            )
        ended = _ended(session)
        if ended is not None:
            return ended
        deadline = session.deadline if session.deadline is not None else time.monotonic() + 3600.0
        sending = asyncio.ensure_future(session.upstream.send(path, body, deadline))
        waiting = asyncio.ensure_future(session.ended.wait())
        try:
            await asyncio.wait(
                {sending, waiting}, timeout=max(0.0, deadline - time.monotonic()), return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if not sending.done():
                await cancel_and_wait(sending)
            await cancel_and_wait(waiting)
        if sending.cancelled():
            session.end("deadline")
            return _ended(session) or Answer.failure(404, "session ended", "session_ended")
        try:
            return sending.result()
        except AgentDeadline:
            session.end("deadline")
            return _ended(session) or Answer.failure(404, "session ended", "session_ended")
        except ModelError as exc:
            return Answer.failure(502, str(exc), "upstream_error")

    async def _models(self, request: Any) -> Any:
        session = self._session(request)
        name = (session.model if session is not None else None) or "termgym"
        data = {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "termgym"}]}
        return _reply(Answer.of_json(200, data))

    async def _calls(self, request: Any) -> Any:
        sid = request.match_info["sid"]
        session = self.sessions.get(sid)
        if session is None:
            return _reply(Answer.failure(404, f"no open termgym session {sid!r}", "session_not_found"))
        return _reply(Answer.of_json(200, session.to_dict()))

    async def _health(self, request: Any) -> Any:
        return _reply(Answer.of_json(200, {"sessions": len(self.sessions)}))


def _ended(session: GatewaySession) -> Answer | None:
    """The 404 of a session that no longer serves calls (closed, or past its deadline), else None."""
    if session.deadline is not None and time.monotonic() >= session.deadline:
        session.end("deadline")
    if session.end_reason is None:
        return None
    why = "its agent time is over" if session.end_reason == "deadline" else "its trial has ended"
    return Answer.failure(404, f"the termgym session {session.id} has ended: {why}", "session_ended")


def _tell_transcript(session: GatewaySession, path: str, answer: Answer) -> None:
    """A chat reply into the trial's transcript, as the model agent records its own."""
    transcript = session.transcript
    if transcript is None or path != CHAT_PATH or answer.data is None:
        return
    completion = answer.completion
    if completion is None:
        try:
            completion = parse_chat_response(answer.data)
        except ModelError:
            return
    transcript.usage.add(completion.prompt_tokens, completion.completion_tokens)
    transcript.reply(completion.reply_record())


def _reply(answer: Answer) -> Any:
    from aiohttp import web

    return web.Response(status=answer.status, body=answer.body, headers=answer.headers)


__all__ = ["SESSION_HEADER", "Gateway", "GatewaySession", "error_body"]
