"""A small OpenAI-compatible API on 127.0.0.1 for tests, with scripted replies and faults, shaped as
the ``openai`` SDK parses them (and, for the extras, as vLLM returns them).

Endpoints (under ``/v1``):

- ``GET /models``: one model, ``{"object": "list", "data": [{"id", "object": "model", "created",
  "owned_by", "root", "parent", "max_model_len"}]}`` (``max_model_len`` as vLLM adds it).
- ``POST /chat/completions``: a ``chat.completion`` with one choice: ``message`` (``role``,
  ``content``, ``tool_calls`` when the reply has some), ``finish_reason``, ``logprobs``, and ``usage``.
  ``"return_token_ids": true`` adds vLLM's top-level ``prompt_token_ids`` and
  ``choices[0].token_ids``; ``"logprobs": true`` fills ``choices[0].logprobs.content`` (one entry per
  completion token, ``top_logprobs`` always empty; ``top_logprobs`` in the request is ignored).
- ``POST /completions``: a ``text_completion``, one choice per prompt: ``prompt`` may be a string, a
  list of token ids, or a list of either (a batch: every choice gets the same reply). With
  ``return_token_ids``, each choice carries ``token_ids`` and ``prompt_token_ids`` (vLLM's place for
  them) and the body a top-level ``prompt_token_ids`` too (the first prompt's; vLLM has no top-level
  one). ``"logprobs": <int>`` (0 included) fills ``{tokens, token_logprobs, top_logprobs,
  text_offset}``, ``top_logprobs`` holding only the sampled token, whatever the int.

Not supported: streaming (``"stream": true`` gets a 400), ``n`` > 1 (ignored: one choice), ``echo``,
``stop``, ``max_tokens`` truncation (a reply is sent whole; use ``length()`` for a cut-off one).
``max_tokens`` / ``max_completion_tokens`` count only in the context-length check.

Tokens: a fake tokenizer with one token per character, the id its code point (``encode`` /
``decode``). A chat prompt is the text ``render_chat(messages)``; a string prompt is itself; a
prompt of token ids is echoed as its ``prompt_token_ids``. A reply's tokens encode
``Reply.raw_text()``: its content, then each tool call as a Hermes ``<tool_call>`` block (what a
vLLM model generates before the tool parser splits it out), unless the reply fixes ``token_ids``.
``usage`` counts these tokens. Each token's logprob is ``token_logprob(id)``.

Scripting (``Script``, the server's ``script``): one FIFO ``queue`` shared by both generation
endpoints (chat and completions), one item consumed per generation request in arrival order; when
it is empty, ``default`` answers (by default ``text("ok")``, never consumed). An item is a ``Reply``
(built by ``text``, ``bash``, ``tool_call``, ``tool_calls``, ``empty``, ``length``), a ``Fault``,
or a callable given the request's JSON body (sync or async) that returns either. ``Script.add``
expands a fault's ``count`` into that many queue entries, so a storm of N takes the next N requests.
``GET /models`` never consumes the generation queue: it has its own ``models_queue`` of faults.
Before any of that, in this order, and consuming nothing: the API key check (``api_key``: 401
unless ``Authorization: Bearer <key>``; on every path), a body that is not a JSON object (400),
``reject_fields`` (a 400 "Unrecognized request argument supplied: <field>" whenever one of these
fields is in the body, whatever its value, as hosted APIs answer vLLM extras), ``"stream": true``
(400), ``enforce_context_length`` (vLLM's context-length 400 when prompt tokens + ``max_tokens`` /
``max_completion_tokens`` exceed ``max_model_len``, or the prompt alone reaches it). Unknown paths
get a 404 in the OpenAI error envelope.

Faults: ``rate_limit`` / ``storm`` (429s with ``Retry-After``, fractional seconds allowed),
``server_error`` (500/502/503..., N in a row, optionally with ``Retry-After``), ``error`` (any
status and OpenAI error envelope, or a raw body), ``hang`` (no answer for a while or until the
server stops, then an answer; a client that gives up cancels it), ``reset`` (the connection is
closed without a response: a TCP reset, or a plain close with ``hard=False``), ``context_length``
(vLLM's 400), ``unknown_param`` (a hosted API's 400 for one request), ``die`` (the server stops
listening, every open connection is cut, the current request gets no answer; later connects are
refused). ``FaultServer.die()`` does the same from the test, ``revive()`` listens again on the same
port.

Every request is recorded in ``requests`` (``RecordedRequest``: loop time of arrival, method, path,
JSON body, headers, status sent (0 when the connection was cut), outcome) before it is answered,
rejected ones included; a connect refused after ``die`` records nothing.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import json
import socket
import struct
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

MODEL = "test-model"
MAX_MODEL_LEN = 4096
FOREVER = None  # hang(FOREVER): until the client gives up or the server stops

# -- fake tokenizer ----------------------------------------------------------------------------


def encode(text: str) -> list[int]:
    """One token per character; the id is the code point."""
    return [ord(char) for char in text]


def decode(ids: Iterable[int]) -> str:
    return "".join(chr(i) if 0 <= i <= 0x10FFFF else "\ufffd" for i in ids)


def token_logprob(token_id: int) -> float:
    """The deterministic logprob reported for a token: in [-0.5, -0.01]."""
    return -round(0.01 * (1 + token_id % 50), 2)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return str(content)


def _hermes(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": {json.dumps(name)}, "arguments": {arguments}}}\n</tool_call>'


def render_chat(messages: Iterable[Mapping[str, Any]]) -> str:
    """The prompt text of a chat request: ``<|role|>\\n`` + content (+ its tool calls as Hermes
    blocks) + ``\\n`` per message, then ``<|assistant|>\\n``."""
    parts = []
    for message in messages:
        text = _content_text(message.get("content"))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            text += _hermes(str(function.get("name", "")), str(function.get("arguments", "")))
        parts.append(f"<|{message.get('role', '')}|>\n{text}\n")
    return "".join(parts) + "<|assistant|>\n"


# -- replies -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # the JSON string sent as is (so it may be malformed)
    id: str | None = None  # None: "call_<request number>_<index>"


@dataclass(frozen=True)
class Reply:
    """A successful answer. ``finish_reason`` None: ``tool_calls`` if there are some, else ``stop``
    (on ``/completions``, ``tool_calls`` becomes ``stop``)."""

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    token_ids: tuple[int, ...] | None = None  # the completion's tokens; None: encode(raw_text())
    message_extra: Mapping[str, Any] = field(default_factory=dict)  # merged into the chat message

    def raw_text(self) -> str:
        """What the fake model generated: the content, then the tool calls as Hermes blocks."""
        calls = [_hermes(call.name, call.arguments) for call in self.tool_calls]
        return "\n".join(([self.content] if self.content else []) + calls)

    def completion_ids(self) -> list[int]:
        return list(self.token_ids) if self.token_ids is not None else encode(self.raw_text())

    def chat_finish_reason(self) -> str:
        return self.finish_reason or ("tool_calls" if self.tool_calls else "stop")


def call(name: str, arguments: Mapping[str, Any] | str | None = None, *, id: str | None = None) -> ToolCall:
    """A tool call: ``arguments`` a dict (sent as JSON) or a string sent as is (malformed JSON too)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(dict(arguments or {}))
    return ToolCall(name, raw, id)


def tool_call(
    name: str, arguments: Mapping[str, Any] | str | None = None, *, content: str | None = None, id: str | None = None
) -> Reply:
    """A reply with one tool call (``finish_reason`` ``tool_calls``)."""
    return Reply(content=content, tool_calls=(call(name, arguments, id=id),))


def tool_calls(*calls: ToolCall | tuple[str, Mapping[str, Any] | str], content: str | None = None) -> Reply:
    """A reply with several tool calls, each a ``call(...)`` or a ``(name, arguments)`` pair."""
    built = tuple(c if isinstance(c, ToolCall) else call(c[0], c[1]) for c in calls)
    return Reply(content=content, tool_calls=built)


def text(content: str) -> Reply:
    """A reply with content only."""
    return Reply(content=content)


def bash(command: str, *, prose: str = "I'll run this.") -> Reply:
    """A text reply holding the command in a fenced ``bash`` block."""
    return Reply(content=f"{prose}\n```bash\n{command}\n```" if prose else f"```bash\n{command}\n```")


def empty(content: str | None = "") -> Reply:
    """A reply with nothing in it: content ``""`` (or ``None``), no tool calls, ``stop``."""
    return Reply(content=content)


def length(content: str = "", *, tool_calls: Iterable[ToolCall] = ()) -> Reply:
    """A reply cut off at the token limit: ``finish_reason`` ``length``."""
    return Reply(content=content, tool_calls=tuple(tool_calls), finish_reason="length")


# -- faults ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """Something else than an answer. ``kind``: ``status`` (an HTTP error: ``status``, ``body`` a
    dict sent as JSON or a string sent as text, ``headers``), ``hang`` (``seconds``, None for
    ever, then ``then``: an item, None for the default reply), ``reset`` (``hard``: a TCP RST,
    else a plain close), ``die``, ``context_length`` (``requested``, ``max_len``: None to compute
    them from the request and the server). ``count``: how many consecutive requests it takes
    (``Script.add`` expands it)."""

    kind: str
    status: int = 0
    body: Mapping[str, Any] | str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    seconds: float | None = None
    then: Item | None = None
    hard: bool = True
    requested: int | None = None
    max_len: int | None = None
    count: int = 1


def _envelope(message: str, type_: str, code: Any = None, param: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _retry_headers(retry_after: float | str | None, headers: Mapping[str, str] | None) -> dict[str, str]:
    out = dict(headers or {})
    if retry_after is not None:
        out["Retry-After"] = retry_after if isinstance(retry_after, str) else f"{retry_after:g}"
    return out


def error(
    status: int,
    message: str = "error",
    *,
    type: str = "invalid_request_error",
    code: Any = None,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
    raw: str | None = None,
    count: int = 1,
) -> Fault:
    """Any HTTP error: the OpenAI envelope ``{"error": {message, type, param, code}}``, or ``raw``
    sent as ``text/plain`` (e.g. a proxy's HTML page)."""
    body = raw if raw is not None else _envelope(message, type, code, param)
    return Fault("status", status=status, body=body, headers=dict(headers or {}), count=count)


def rate_limit(
    retry_after: float | str | None = 0.05, *, count: int = 1, headers: Mapping[str, str] | None = None
) -> Fault:
    """A 429 with ``Retry-After: <retry_after>`` (a float is written with ``%g``: ``0.05``; a string
    as is, e.g. an HTTP date; None: no header)."""
    return error(
        429,
        "Rate limit reached for requests. Please try again later.",
        type="requests",
        code="rate_limit_exceeded",
        headers=_retry_headers(retry_after, headers),
        count=count,
    )


def storm(n: int, retry_after: float | str | None = 0.05) -> Fault:
    """``n`` consecutive 429s."""
    return rate_limit(retry_after, count=n)


_SERVER_MESSAGES = {
    500: "The server had an error while processing your request. Sorry about that!",
    502: "Bad gateway.",
    503: "The server is overloaded or not ready yet.",
}


def server_error(
    status: int = 500,
    *,
    count: int = 1,
    retry_after: float | str | None = None,
    message: str | None = None,
    raw: str | None = None,
) -> Fault:
    """``count`` consecutive 5xx (``server_error`` envelope, or ``raw`` text). ``retry_after`` adds
    the header, which the SDK honours on any retried status (to keep retrying tests fast)."""
    text_ = message or _SERVER_MESSAGES.get(status, "Server error.")
    headers = _retry_headers(retry_after, None)
    return error(status, text_, type="server_error", headers=headers, raw=raw, count=count)


def hang(seconds: float | None = FOREVER, then: Item | None = None) -> Fault:
    """No answer for ``seconds`` (None: until the client gives up or the server stops), then
    ``then`` (an item; None: the default reply). A client that disconnects cancels it."""
    return Fault("hang", seconds=seconds, then=then)


def reset(*, hard: bool = True) -> Fault:
    """The connection closes without a response: a TCP reset, or with ``hard=False`` a FIN."""
    return Fault("reset", hard=hard)


def die() -> Fault:
    """The server stops listening and cuts every connection, this request's included."""
    return Fault("die")


def context_length(requested: int | None = None, max_len: int | None = None) -> Fault:
    """vLLM's 400 for a prompt too long; None: the request's own numbers and ``max_model_len``."""
    return Fault("context_length", requested=requested, max_len=max_len)


def unknown_param(name: str = "return_token_ids") -> Fault:
    """A hosted API's 400 for a field it does not know (one request; see ``Script.reject_fields``)."""
    return error(400, f"Unrecognized request argument supplied: {name}")


Answer = Reply | Fault
Item = Reply | Fault | Callable[[dict[str, Any]], "Answer | Awaitable[Answer]"]


@dataclass
class Script:
    """What the server answers; see the module docstring for the order of checks."""

    queue: deque[Item] = field(default_factory=deque)  # chat and completions, one per request
    default: Item = field(default_factory=lambda: text("ok"))  # when the queue is empty; not consumed
    models_queue: deque[Fault] = field(default_factory=deque)  # GET /v1/models, one per request
    reject_fields: set[str] = field(default_factory=set)  # 400 whenever one of these is in the body
    enforce_context_length: bool = False  # 400 when prompt + max_tokens > max_model_len

    def add(self, *items: Item) -> Script:
        """Queue items in order; a fault with ``count`` N becomes N entries."""
        for item in items:
            if isinstance(item, Fault) and item.count > 1:
                self.queue.extend(replace(item, count=1) for _ in range(item.count))
            else:
                self.queue.append(item)
        return self


# -- the server --------------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    time: float  # the event loop's clock at arrival
    method: str
    path: str
    body: Any  # the parsed JSON body; None when there is none (or it is not JSON)
    headers: CIMultiDictProxy[str]
    status: int = 0  # the status sent; 0 when none was (reset, hang cut short, die)
    # What answered: "reply", or the fault's kind ("status", "hang" (even once it answered), "reset", "die",
    # "context_length"), or "auth" / "reject" for the checks before the script.
    outcome: str = ""
    cut: bool = False  # the connection was closed without a response


_RECORD = web.RequestKey("record", RecordedRequest)


class FaultServer:
    """``async with FaultServer(...) as server:`` (or ``await start()`` / ``await stop()``), then
    ``AsyncOpenAI(base_url=server.base_url, api_key=...)``."""

    def __init__(
        self,
        *,
        model: str = MODEL,
        max_model_len: int = MAX_MODEL_LEN,
        api_key: str | None = None,
        script: Script | None = None,
    ) -> None:
        self.model = model
        self.max_model_len = max_model_len
        self.api_key = api_key
        self.script = script or Script()
        self.requests: list[RecordedRequest] = []
        self.port = 0
        self.dead = False
        self._runner: web.AppRunner | None = None
        self._stopping = asyncio.Event()
        self._ids = itertools.count(1)

    # -- lifecycle and inspection ----------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def add(self, *items: Item) -> FaultServer:
        self.script.add(*items)
        return self

    def requests_to(self, path: str) -> list[RecordedRequest]:
        """The requests to ``/v1/<path>`` (e.g. ``"chat/completions"``)."""
        return [r for r in self.requests if r.path == f"/v1/{path.lstrip('/')}"]

    async def start(self) -> FaultServer:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        # handler_cancellation: a client that gives up cancels its hanging handler.
        self._runner = web.AppRunner(app, handle_signals=False, handler_cancellation=True, shutdown_timeout=1.0)
        await self._runner.setup()
        self._stopping = asyncio.Event()
        await self._listen(0)
        return self

    async def _listen(self, port: int) -> None:
        assert self._runner is not None
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        (address,) = self._runner.addresses  # the one listening socket
        self.port = address[1]

    async def stop(self) -> None:
        self._stopping.set()  # hanging handlers wake and cut their connections
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> FaultServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def die(self) -> None:
        """Stop listening (later connects are refused) and cut every open connection."""
        self.dead = True
        if self._runner is None:
            return
        for site in list(self._runner.sites):
            await site.stop()
        server = self._runner.server
        for handler in server.connections if server is not None else []:
            if handler.transport is not None:
                _abort(handler.transport, hard=True)

    async def revive(self) -> None:
        """Listen again, on the same port, after ``die``."""
        if self._runner is not None and self.dead:
            await self._listen(self.port)
            self.dead = False

    # -- plumbing --------------------------------------------------------------------------------

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        arrived = asyncio.get_running_loop().time()
        body: Any = None
        if request.can_read_body:
            try:
                body = await request.json()
            except ValueError:
                body = None
        record = RecordedRequest(
            arrived,
            request.method,
            request.path,
            body,
            CIMultiDictProxy(CIMultiDict(request.headers)),
        )
        self.requests.append(record)
        request[_RECORD] = record
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            record.outcome = "auth"
            message = "Incorrect API key provided. You can find your API key at https://platform.openai.com."
            response: web.StreamResponse = _json(401, _envelope(message, "invalid_request_error", "invalid_api_key"))
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:  # 404, 405 from the router: in the API's envelope
                response = _json(exc.status, _envelope(exc.reason, "invalid_request_error"))
        record.status = 0 if record.cut else response.status
        return response

    async def _models(self, request: web.Request) -> web.StreamResponse:
        if self.script.models_queue:
            return await self._fault(request, self.script.models_queue.popleft(), {})
        return self._model_list(request)

    def _model_list(self, request: web.Request) -> web.Response:
        request[_RECORD].outcome = request[_RECORD].outcome or "reply"
        model = {
            "id": self.model,
            "object": "model",
            "created": 0,
            "owned_by": "test",
            "root": self.model,
            "parent": None,
            "max_model_len": self.max_model_len,
        }
        return _json(200, {"object": "list", "data": [model]})

    async def _generation(
        self, request: web.Request, prompts: Callable[[dict[str, Any]], list[list[int]]], *, chat: bool
    ) -> web.StreamResponse:
        record: RecordedRequest = request[_RECORD]
        body = record.body
        if not isinstance(body, dict):
            record.outcome = "reject"
            return _json(400, _envelope("The request body is not a JSON object.", "BadRequestError", 400))
        for name in sorted(self.script.reject_fields):
            if name in body:
                record.outcome = "reject"
                return _json(400, _envelope(f"Unrecognized request argument supplied: {name}", "invalid_request_error"))
        if body.get("stream"):
            record.outcome = "reject"
            return _json(400, _envelope("Streaming is not supported by this test server.", "BadRequestError", 400))
        prompt_ids = prompts(body)
        if self.script.enforce_context_length:
            prompt = len(prompt_ids[0]) if prompt_ids else 0
            if prompt + _max_tokens(body) > self.max_model_len or prompt >= self.max_model_len:
                record.outcome = "context_length"
                return self._context_error(body, prompt, None, None)
        item = self.script.queue.popleft() if self.script.queue else self.script.default
        return await self._answer(request, item, body, prompt_ids, chat)

    async def _answer(
        self, request: web.Request, item: Item | None, body: dict[str, Any], prompt_ids: list[list[int]], chat: bool
    ) -> web.StreamResponse:
        if item is None:
            item = self.script.default
        if callable(item) and not isinstance(item, Reply | Fault):
            result = item(body)
            item = await result if inspect.isawaitable(result) else result
        if isinstance(item, Fault):
            return await self._fault(request, item, body, prompt_ids, chat)
        if not isinstance(item, Reply):
            raise TypeError(f"a script item must be a Reply or a Fault, got {item!r}")
        request[_RECORD].outcome = request[_RECORD].outcome or "reply"
        number = next(self._ids)
        if chat:
            return _json(200, self._chat_body(item, body, prompt_ids[0], number))
        return _json(200, self._completion_body(item, body, prompt_ids, number))

    async def _fault(
        self,
        request: web.Request,
        fault: Fault,
        body: dict[str, Any],
        prompt_ids: list[list[int]] | None = None,
        chat: bool = True,
    ) -> web.StreamResponse:
        record: RecordedRequest = request[_RECORD]
        record.outcome = record.outcome or fault.kind  # a hang's answer keeps "hang"
        if fault.kind == "status":
            if isinstance(fault.body, str):
                return web.Response(status=fault.status, text=fault.body, headers=dict(fault.headers))
            return _json(fault.status, dict(fault.body or {}), headers=fault.headers)
        if fault.kind == "context_length":
            return self._context_error(body, len((prompt_ids or [[]])[0]), fault.requested, fault.max_len)
        if fault.kind == "hang":
            try:
                await asyncio.wait_for(self._stopping.wait(), fault.seconds)
            except TimeoutError:
                if prompt_ids is None:  # on /models: the model list
                    return self._model_list(request)
                return await self._answer(request, fault.then, body, prompt_ids, chat)
            return self._cut(request, hard=True)  # the server stops
        if fault.kind == "reset":
            return self._cut(request, hard=fault.hard)
        if fault.kind == "die":
            await self.die()
            return self._cut(request, hard=True)
        raise ValueError(f"unknown fault kind {fault.kind!r}")

    def _cut(self, request: web.Request, *, hard: bool) -> web.StreamResponse:
        """Close the connection without a response; aiohttp then fails to write the returned one
        and drops it as a premature disconnect."""
        request[_RECORD].cut = True
        if request.transport is not None:
            _abort(request.transport, hard=hard)
        return web.Response(status=499)

    def _context_error(
        self, body: dict[str, Any], prompt: int, requested: int | None, max_len: int | None
    ) -> web.Response:
        """vLLM's 400; ``requested`` / ``max_len`` None: the request's tokens, ``max_model_len``."""
        limit = max_len if max_len is not None else self.max_model_len
        max_tokens = _max_tokens(body)
        total = requested if requested is not None else prompt + max_tokens
        in_prompt = total - max_tokens if requested is not None else prompt
        message = (
            f"This model's maximum context length is {limit} tokens. However, you requested {total} tokens "
            f"({in_prompt} in the messages, {max_tokens} in the completion). "
            "Please reduce the length of the messages or completion."
        )
        return _json(400, _envelope(message, "BadRequestError", 400))

    # -- bodies ------------------------------------------------------------------------------------

    def _model_name(self, body: dict[str, Any]) -> str:
        return body["model"] if isinstance(body.get("model"), str) else self.model

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, self._chat_prompt, chat=True)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generation(request, self._completion_prompts, chat=False)

    @staticmethod
    def _chat_prompt(body: dict[str, Any]) -> list[list[int]]:
        messages = body.get("messages")
        return [encode(render_chat(m for m in messages if isinstance(m, dict)) if isinstance(messages, list) else "")]

    @staticmethod
    def _completion_prompts(body: dict[str, Any]) -> list[list[int]]:
        prompt = body.get("prompt", "")
        if isinstance(prompt, str):
            return [encode(prompt)]
        if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
            return [list(prompt)]
        if isinstance(prompt, list) and prompt:
            return [encode(p) if isinstance(p, str) else [int(i) for i in p] for p in prompt]
        return [[]]

    def _chat_body(self, reply: Reply, body: dict[str, Any], prompt_ids: list[int], number: int) -> dict[str, Any]:
        ids = reply.completion_ids()
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": c.id or f"call_{number}_{i}",
                    "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments},
                }
                for i, c in enumerate(reply.tool_calls)
            ]
        message.update(reply.message_extra)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": reply.chat_finish_reason()}
        choice["logprobs"] = None
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {
                        "token": decode([i]),
                        "logprob": token_logprob(i),
                        "bytes": list(decode([i]).encode("utf-8", "replace")),
                        "top_logprobs": [],
                    }
                    for i in ids
                ]
            }
        out: dict[str, Any] = {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self._model_name(body),
            "choices": [choice],
            "usage": _usage(len(prompt_ids), len(ids)),
        }
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
            out["prompt_token_ids"] = prompt_ids
        return out

    def _completion_body(
        self, reply: Reply, body: dict[str, Any], prompts: list[list[int]], number: int
    ) -> dict[str, Any]:
        ids = reply.completion_ids()
        completion_text = decode(ids) if reply.token_ids is not None else reply.raw_text()
        finish = "stop" if reply.chat_finish_reason() == "tool_calls" else reply.chat_finish_reason()
        with_ids = bool(body.get("return_token_ids"))
        logprobs = body.get("logprobs")
        choices = []
        for index, prompt_ids in enumerate(prompts):
            choice: dict[str, Any] = {
                "index": index,
                "text": completion_text,
                "finish_reason": finish,
                "logprobs": None,
            }
            if logprobs is not None and logprobs is not False:
                tokens = [decode([i]) for i in ids]
                choice["logprobs"] = {
                    "tokens": tokens,
                    "token_logprobs": [token_logprob(i) for i in ids],
                    "top_logprobs": [{t: token_logprob(i)} for t, i in zip(tokens, ids, strict=True)],
                    "text_offset": list(itertools.accumulate((len(t) for t in tokens), initial=0))[:-1],
                }
            if with_ids:
                choice["token_ids"] = ids
                choice["prompt_token_ids"] = prompt_ids
            choices.append(choice)
        out: dict[str, Any] = {
            "id": f"cmpl-{number}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self._model_name(body),
            "choices": choices,
            "usage": _usage(sum(len(p) for p in prompts), len(ids) * len(prompts)),
        }
        if with_ids:
            out["prompt_token_ids"] = prompts[0]
        return out


def _max_tokens(body: Mapping[str, Any]) -> int:
    value = body.get("max_completion_tokens") or body.get("max_tokens") or 0
    return value if isinstance(value, int) else 0


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _json(status: int, body: Mapping[str, Any], *, headers: Mapping[str, str] | None = None) -> web.Response:
    return web.json_response(dict(body), status=status, headers=dict(headers or {}))


def _abort(transport: asyncio.BaseTransport, *, hard: bool) -> None:
    if hard:  # SO_LINGER 0: close() sends a RST instead of a FIN
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        if isinstance(transport, asyncio.Transport):
            transport.abort()
            return
    transport.close()
