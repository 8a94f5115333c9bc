"""Where the gateway sends a session's calls: an OpenAI-compatible server over HTTP
(``ForwardUpstream``), or a termgym model session in this process (``SessionUpstream``: the
trainer's samplers, the scripted teacher, the tokens client).

Each answers ``send(path, body, deadline) -> Answer``: the status, headers and body the harness
gets, with the token ids and log-probs read from it for the record.

``ForwardUpstream`` forwards the harness's request with the run's forced settings and asks for
vLLM's ``return_token_ids`` and log-probs; a server that rejects one of them (a 400 naming it, as
hosted APIs answer) is asked again without it, once, and the loss is noted on the call and
remembered. Everything else passes through as the harness expects it: status codes, the body,
``Retry-After`` and the rate-limit headers; the gateway never retries (the harness does). An
upstream that cannot be reached is a 502 in the OpenAI error envelope.

``SessionUpstream`` serves chat completions from a termgym ``Session`` (``termgym.agents.client``).
While the harness's messages extend what the model saw (``shapes.extends``), the session gets its
own history plus the new messages, so a token-exact session (``RenderedSession``) bridges instead
of rendering again; a history the harness rewrote starts a new segment, counted as a break of the
one it ended. The session writes its segments into the trial's transcript itself.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from termgym.agents.client import Completion, Session
from termgym.agents.transport import envelope_message, named_field
from termgym.errors import AgentDeadline, ContextExceeded, ModelError
from termgym.gateway.calls import CHAT_PATH, COMPLETIONS_PATH
from termgym.gateway.shapes import chat_response, clean_message, error_body, extends
from termgym.transcript import Transcript

# The response headers a harness may act on; the rest (hop-by-hop, lengths) are the gateway's own.
PASSED_HEADERS = ("retry-after", "retry-after-ms", "content-type")
PASSED_PREFIXES = ("x-ratelimit-",)
TOKEN_FIELDS = ("return_token_ids", "logprobs")


@dataclass
class Answer:
    """What the harness is answered: status, headers, body; ``data`` the body's JSON object (None
    when it is not one); ``completion`` the parsed reply when an in-process session made it."""

    status: int
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    data: dict[str, Any] | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)
    completion: Completion | None = None
    sent: dict[str, Any] | None = None  # the body sent upstream, when it differs from the harness's

    @classmethod
    def of_json(cls, status: int, data: dict[str, Any], *, error: str | None = None) -> Answer:
        body = json.dumps(data).encode()
        return cls(status, body, {"content-type": "application/json"}, data, error)

    @classmethod
    def failure(cls, status: int, message: str, kind: str) -> Answer:
        return cls.of_json(status, error_body(message, kind, status), error=message)


class Upstream(Protocol):
    """One session's model, as the gateway reaches it."""

    records_segments: bool  # True: the upstream writes the transcript's token segments itself

    async def send(self, path: str, body: dict[str, Any], deadline: float) -> Answer:
        """The answer to ``body`` sent to ``path`` (``/chat/completions`` or ``/completions``),
        by ``deadline`` (``time.monotonic()``); the gateway bounds the wait itself as well."""
        ...


@dataclass
class ForwardUpstream:
    """An OpenAI-compatible server at ``base_url`` (module docstring). ``http`` is an
    ``aiohttp.ClientSession`` the gateway shares among its sessions; ``forced`` overrides request
    fields (``temperature`` for training against evaluation); ``dropped`` is shared too, so a field
    one session learned is rejected is not asked again by the others."""

    base_url: str
    http: Any
    api_key: str | None = None
    forced: dict[str, Any] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)
    records_segments: bool = False

    def request_body(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` with the forced settings and the token fields not known to be rejected."""
        out = {**body, **self.forced}
        if "return_token_ids" not in self.dropped:
            out["return_token_ids"] = True
        if "logprobs" not in self.dropped and not out.get("logprobs"):
            out["logprobs"] = True if path == CHAT_PATH else 1
        for name in self.dropped:
            if name not in body:
                out.pop(name, None)
        return out

    async def send(self, path: str, body: dict[str, Any], deadline: float) -> Answer:
        notes: list[str] = []
        while True:
            request = self.request_body(path, body)
            answer = await self._post(path, request, deadline)
            rejected = _rejected_field(answer, [k for k in TOKEN_FIELDS if k in request and k not in body])
            if rejected is None:
                answer.notes += notes
                answer.sent = request
                return answer
            self.dropped.add(rejected)
            notes.append(f"the upstream rejects {rejected}: asked again without it")

    async def _post(self, path: str, request: dict[str, Any], deadline: float) -> Answer:
        import aiohttp

        headers = {"content-type": "application/json"}
        if self.api_key:
            headers["authorization"] = f"Bearer {self.api_key}"
        remaining = max(1e-3, deadline - time.monotonic())
        try:
            async with self.http.post(
                self.base_url.rstrip("/") + path,
                data=json.dumps(request),
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=remaining),
            ) as response:
                raw = await response.read()
                passed = {
                    k.lower(): v
                    for k, v in response.headers.items()
                    if k.lower() in PASSED_HEADERS or k.lower().startswith(PASSED_PREFIXES)
                }
                status = response.status
        except TimeoutError:
            raise AgentDeadline("the agent time ran out waiting for the upstream") from None
        except aiohttp.ClientError as exc:
            message = f"the gateway cannot reach the upstream {self.base_url}: {' '.join(str(exc).split())[:200]}"
            return Answer.failure(502, message, "upstream_unreachable")
        data = _json_object(raw)
        error = None if status == 200 else f"upstream HTTP {status}: {_error_message(data, raw)}"
        return Answer(status, raw, passed, data, error)


@dataclass
class SessionUpstream:
    """A termgym ``Session`` serving chat completions (module docstring). ``max_tokens`` caps each
    reply whatever the harness asks; ``transcript`` gets each reply and its usage."""

    session: Session
    transcript: Transcript
    model: str
    max_tokens: int = 4096
    records_segments: bool = True
    _sent: list[dict[str, Any]] = field(default_factory=list)  # what the session saw, its reply included

    async def send(self, path: str, body: dict[str, Any], deadline: float) -> Answer:
        if path != CHAT_PATH:
            return Answer.failure(
                400, f"this gateway session serves {CHAT_PATH} only, not {path}", "invalid_request_error"
            )
        raw_messages = body.get("messages")
        if not isinstance(raw_messages, list) or not raw_messages:
            return Answer.failure(400, "messages must be a non-empty list", "invalid_request_error")
        tools = body.get("tools") if isinstance(body.get("tools"), list) and body.get("tools") else None
        if self._sent and extends(self._sent, raw_messages):
            messages = [*self._sent, *(clean_message(m) for m in raw_messages[len(self._sent) :])]
        else:
            if self._sent:  # the harness rewrote its history: a new sample, counted
                self.transcript.segment.bridge_breaks += 1
                self.transcript.notes.append(f"call {len(self.transcript.turns)}: the harness rewrote its history")
                self.session.new_segment("harness_rewrite")
            messages = [clean_message(m) for m in raw_messages]
        asked = body.get("max_completion_tokens") or body.get("max_tokens")
        budget = min(self.max_tokens, asked) if isinstance(asked, int) and asked > 0 else self.max_tokens
        try:
            completion = await self.session.complete(messages, tools=tools, max_tokens=budget, deadline=deadline)
        except ContextExceeded as exc:
            # litellm and most harnesses read this wording as a context-window error (not retried)
            message = f"This model's maximum context length is exceeded: {exc}"
            return Answer.failure(400, message, "invalid_request_error")
        except AgentDeadline:
            raise
        except ModelError as exc:
            return Answer.failure(502, str(exc), "upstream_error")
        self._sent = [*messages, completion.message]
        answer = Answer.of_json(200, chat_response(completion, self.model))
        answer.completion = completion
        return answer


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _error_message(data: dict[str, Any] | None, raw: bytes) -> str:
    said = envelope_message(data, 300)
    return said if said is not None else " ".join(raw[:300].decode("utf-8", "replace").split())


def _rejected_field(answer: Answer, asked: list[str]) -> str | None:
    """The token field a 400 complains about, when the gateway added it (not the harness); named as
    a whole word (a complaint about ``top_logprobs`` is not one about ``logprobs``)."""
    if answer.status != 400 or not asked:
        return None
    return named_field(_error_message(answer.data, answer.body), asked)


__all__ = ["COMPLETIONS_PATH", "Answer", "ForwardUpstream", "SessionUpstream", "Upstream"]
