"""The model agent's client seam, and the chat client: any OpenAI-compatible ``/v1/chat/completions``
server (vLLM, SGLang, a hosted API) through the official async ``openai`` SDK.

A ``ModelClient`` opens one ``Session`` per episode; ``Session.complete(messages, ...)`` answers a
``Completion``: the reply's text, reasoning and tool calls, the assistant message to append to the
history, usage, and (when the server returns them) the prompt ids, the completion ids and the
per-token log-probs. The chat client lets the server render the chat template; the tokens client
(``termgym.agents.tokens``) renders itself and is token-exact.

Faults: 408, 409, 429 (honouring ``Retry-After``), 5xx, connection errors and timeouts are retried
by the SDK (``max_retries``, exponential backoff with jitter); each attempt is bounded by
``request_timeout`` and the whole request by the episode's remaining agent time
(``AgentDeadline``). What is still failing after that is a ``ModelError`` (the trial's error kind
``model_error``); a prompt that does not fit the context window is ``ContextExceeded``. A server
that rejects the optional fields (``return_token_ids``, ``logprobs``: hosted APIs do) is asked
again without them, once, and the client remembers (``notes``).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlparse

from termgym.agents.actions import ToolCall
from termgym.errors import ConfigError, ModelError, TermgymError
from termgym.transcript import Transcript

DEFAULT_REQUEST_TIMEOUT = 600.0
DEFAULT_MAX_RETRIES = 4
OPTIONAL_FIELDS = ("return_token_ids", "logprobs")  # asked for, dropped where a server rejects them
# vLLM: "your prompt contains [at least] N input tokens", "max_tokens=M cannot be greater than
# max_model_len=W"; OpenAI: "you requested T tokens (N in the messages, M in the completion)".
_PROMPT_LENGTH = re.compile(
    r"contains (?:at least )?(\d+) input tokens|(\d+) in the messages|request has (\d+) input tokens"
)
_CONTEXT_ERROR = re.compile(
    r"maximum context length|context length|context_length_exceeded|too many tokens|greater than max_model_len", re.I
)


class ContextExceeded(ModelError):
    """The prompt (with the reply's token budget) does not fit the model's context window."""

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt's length in tokens when the server's message says it (vLLM's wordings)."""
        found = _PROMPT_LENGTH.search(str(self))
        return int(next(g for g in found.groups() if g)) if found else None


class AgentDeadline(TermgymError):
    """The episode's agent time ran out while a request was in flight."""

    kind = "agent_timeout"


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


@dataclass(frozen=True)
class Endpoint:
    """Where the model is served and how to authenticate. ``api_key_env``: the environment variable
    holding the key (None: no key, as a local vLLM server needs none)."""

    base_url: str
    model: str
    api_key: str | None = None
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    max_retries: int = DEFAULT_MAX_RETRIES

    def __post_init__(self) -> None:
        check_base_url(self.base_url)
        if not self.model:
            raise ConfigError("a model name is needed (--model)")
        if self.request_timeout <= 0:
            raise ConfigError(f"the request timeout must be positive, got {self.request_timeout}")
        if self.max_retries < 0:
            raise ConfigError(f"max retries must be at least 0, got {self.max_retries}")


def check_base_url(url: str) -> None:
    """One line (``ConfigError``) unless ``url`` is an http(s) URL with a host."""
    try:
        parsed = urlparse(url)
        hostname = parsed.hostname
    except ValueError as exc:  # an unbalanced or invalid [IPv6] host
        raise ConfigError(f"the model's base URL is not a URL ({exc}): {url!r}") from None
    if parsed.scheme not in ("http", "https") or not hostname:
        raise ConfigError(f"the model's base URL must be http(s)://host[:port]/..., got {url!r}")
    try:
        parsed.port  # noqa: B018  # raises on a port out of range
    except ValueError:
        raise ConfigError(f"the model's base URL has a bad port: {url!r}") from None


def resolve_api_key(api_key_env: str | None, environ: dict[str, str]) -> str | None:
    """The key from ``api_key_env``; a variable that is named but unset or empty is a ``ConfigError``."""
    if api_key_env is None:
        return None
    key = environ.get(api_key_env, "")
    if not key:
        raise ConfigError(f"the API key variable {api_key_env} is not set (--api-key-env)")
    return key


def openai_client(endpoint: Endpoint, *, connections: int = 1000) -> Any:
    """The SDK's async client for ``endpoint``: its retries and timeout set, on the SDK's aiohttp
    transport with a pool that keeps up to ``connections`` connections alive (one per concurrent
    episode). The aiohttp transport, not the default one, because the default pool checks every
    idle connection with system calls on each request: a third of the CPU at 250 episodes
    (bench/model_agent.py)."""
    import httpx2
    import openai

    limits = httpx2.Limits(max_connections=connections, max_keepalive_connections=connections, keepalive_expiry=30)
    return openai.AsyncOpenAI(
        base_url=endpoint.base_url,
        api_key=endpoint.api_key or "EMPTY",
        max_retries=endpoint.max_retries,
        timeout=openai.Timeout(endpoint.request_timeout, connect=min(10.0, endpoint.request_timeout)),
        http_client=openai.DefaultAioHttpClient(limits=limits),
    )


def post(sdk: Any, path: str, body: dict[str, Any]) -> Any:
    """``POST path`` with a JSON body the caller built, through the SDK's request path (its retries,
    timeouts and errors), answering the raw body: without the SDK's per-message type transform
    (it walks the whole history every turn, 0.2 ms of CPU per message) and its typed response
    objects (one per log-prob). bench/model_agent.py measures both."""
    return sdk.post(path, body=body, cast_to=bytes)


async def call(request: Any, deadline: float, describe: str) -> Any:
    """Await an SDK request, bounded by ``deadline``; SDK errors become ``ModelError`` /
    ``ContextExceeded`` (one line), the deadline ``AgentDeadline``."""
    import openai

    remaining = deadline - time.monotonic()
    if remaining <= 0:
        request.close()
        raise AgentDeadline("the agent timeout ran out before the request")
    try:
        return await asyncio.wait_for(request, remaining)
    except TimeoutError:
        raise AgentDeadline(f"the agent timeout ran out waiting for {describe}") from None
    except openai.BadRequestError as exc:
        message = _error_message(exc)
        if _CONTEXT_ERROR.search(message):
            raise ContextExceeded(f"{describe}: {message}") from exc
        raise ModelError(f"{describe}: HTTP 400: {message}") from exc
    except openai.APIStatusError as exc:
        raise ModelError(f"{describe}: HTTP {exc.status_code}: {_error_message(exc)}") from exc
    except openai.APITimeoutError as exc:
        raise ModelError(f"{describe}: no answer within the request timeout") from exc
    except openai.APIConnectionError as exc:
        cause = exc.__cause__ or exc
        raise ModelError(f"{describe}: cannot connect: {cause}") from exc
    except openai.APIError as exc:  # a malformed answer
        raise ModelError(f"{describe}: {exc}") from exc


def _error_message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return " ".join(str(inner["message"]).split())[:500]
        if isinstance(body.get("message"), str):
            return " ".join(body["message"].split())[:500]
    return " ".join(str(getattr(exc, "message", exc)).split())[:500]


def rejected_field(exc: BaseException, fields: Sequence[str]) -> str | None:
    """The optional request field a 400 complains about, if it names one of ``fields``."""
    cause = exc.__cause__
    message = _error_message(cause) if cause is not None else str(exc)
    return next((name for name in fields if name in message), None)


async def served_context_window(client: Any, model: str, deadline: float) -> int | None:
    """``max_model_len`` of ``model`` from the server's ``GET /models`` (vLLM and SGLang report it),
    or None when the server does not say; ``ModelError`` / ``AgentDeadline`` when it cannot be asked."""
    page = await call(client.models.list(), deadline, "GET /models")
    for entry in getattr(page, "data", []) or []:
        extra = getattr(entry, "model_extra", None) or {}
        if getattr(entry, "id", None) == model and isinstance(extra.get("max_model_len"), int):
            return extra["max_model_len"]
    return None


@dataclass
class Server:
    """One model server as both clients use it: the SDK client (made on first use) and the context
    window (``context_length``, else what the server reports, asked once: an ask that failed is
    tried again on the next episode)."""

    endpoint: Endpoint
    connections: int = 1000
    context_length: int | None = None
    _sdk: Any = None
    _window: int | None = None
    _asked: bool = False
    _asking: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def model(self) -> str:
        return self.endpoint.model

    @property
    def sdk(self) -> Any:
        if self._sdk is None:
            self._sdk = openai_client(self.endpoint, connections=self.connections)
        return self._sdk

    async def context_window(self, deadline: float | None = None) -> int | None:
        if self.context_length is not None or self._asked:
            return self.context_length or self._window
        async with self._asking:  # episodes starting together ask once
            if self._asked:
                return self._window
            limit = time.monotonic() + 30
            try:
                self._window = await served_context_window(self.sdk, self.model, min(limit, deadline or limit))
            except (ModelError, AgentDeadline):
                return None
            self._asked = True
            return self._window

    async def aclose(self) -> None:
        if self._sdk is not None:
            sdk, self._sdk = self._sdk, None
            await sdk.close()


@dataclass
class ChatClient:
    """A model behind ``/v1/chat/completions``; the server renders the chat template and parses
    tool calls (vLLM: ``--enable-auto-tool-choice --tool-call-parser NAME``)."""

    server: Server
    temperature: float = 1.0
    logprobs: bool = True
    _dropped: set[str] = field(default_factory=set)

    @property
    def model(self) -> str:
        return self.server.model

    def session(self, transcript: Transcript) -> ChatSession:
        return ChatSession(self, transcript)

    async def context_window(self, deadline: float | None = None) -> int | None:
        return await self.server.context_window(deadline)

    async def aclose(self) -> None:
        await self.server.aclose()

    async def create(self, body: dict[str, Any], deadline: float, transcript: Transcript | None) -> dict[str, Any]:
        """``POST /chat/completions`` of ``body`` without the optional fields the server rejected."""
        describe = f"{self.server.endpoint.base_url} chat completion"
        while True:
            request = {k: v for k, v in body.items() if k not in self._dropped}
            try:
                return json_body(
                    await call(post(self.server.sdk, "/chat/completions", request), deadline, describe), describe
                )
            except ModelError as exc:
                optional = [k for k in OPTIONAL_FIELDS if k in request]
                name = None if isinstance(exc, ContextExceeded) else rejected_field(exc, optional)
                if name is None:
                    raise
                self._dropped.add(name)
                if transcript is not None:
                    transcript.notes.append(f"the server rejects {name}: asked without it")


@dataclass
class ChatSession:
    client: ChatClient
    transcript: Transcript
    _last_prompt_tokens: int | None = None
    _last_completion_tokens: int = 0
    _last_message_count: int = 0
    _seen: list[int] = field(default_factory=list)  # the server's last prompt and reply ids

    async def complete(
        self, messages: list[dict[str, Any]], *, tools: list[dict] | None, max_tokens: int, deadline: float
    ) -> Completion:
        client = self.client
        body: dict[str, Any] = {
            "model": client.model,
            "messages": messages,
            "temperature": client.temperature,
            "max_tokens": max_tokens,
            "return_token_ids": True,
        }
        if tools:
            body["tools"] = tools
            body["tool_choice"] = "auto"
        if client.logprobs:
            body["logprobs"] = True
        started = time.monotonic()
        response = await client.create(body, deadline, self.transcript)
        completion = parse_chat_response(response)
        completion.latency = time.monotonic() - started
        self._last_prompt_tokens = completion.prompt_tokens
        self._last_completion_tokens = completion.completion_tokens
        self._last_message_count = len(messages)
        self._keep_extension(completion)
        return completion

    def _keep_extension(self, completion: Completion) -> None:
        """When the server's prompt extends its last prompt and reply (its render of the history is
        stable), keep only the new ids as the turn's bridge: the transcript stays linear in the
        episode's length. Otherwise the full prompt stays, and the change is noted."""
        if completion.prompt_ids is None or completion.completion_ids is None:
            return
        seen = self._seen
        prompt = completion.prompt_ids
        if seen and len(prompt) >= len(seen) and prompt[: len(seen)] == seen:
            completion.bridge = prompt[len(seen) :]
            seen.extend(completion.bridge)
        else:
            if seen:
                self.transcript.notes.append(
                    f"turn {len(self.transcript.turns)}: the server's render of the history changed"
                )
            self._seen = seen = list(prompt)
        seen.extend(completion.completion_ids)

    def new_segment(self, reason: str) -> None:
        self.transcript.new_segment(reason)
        self._last_prompt_tokens = None
        self._seen = []

    def prompt_tokens(self, messages: list[dict[str, Any]]) -> int | None:
        """An estimate: the last prompt and reply, plus about one token per three characters added."""
        if self._last_prompt_tokens is None:
            return None
        added = sum(len(str(m.get("content") or "")) for m in messages[self._last_message_count + 1 :])
        return self._last_prompt_tokens + self._last_completion_tokens + added // 3 + 8

    def cut_tokens(self, text: str) -> str:
        return text


def parse_chat_response(response: dict[str, Any]) -> Completion:
    """A chat completion's JSON to a ``Completion``; a response without a usable choice is a
    ``ModelError``. Read from the JSON, not the SDK's typed objects: building those is a third of
    the client's CPU per turn (one object per log-prob)."""
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ModelError("the chat completion has no choices")
    choice = choices[0]
    message = choice.get("message")
    if not isinstance(message, dict):
        raise ModelError("the chat completion's choice has no message")
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    calls = []
    for i, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            name, arguments = function.get("name"), function.get("arguments")
            calls.append(
                ToolCall(
                    str(call.get("id") or f"call_{i}"),
                    name if isinstance(name, str) and name else None,
                    arguments if isinstance(arguments, str) else json.dumps(arguments or {}),
                )
            )
    text = message.get("content")
    content = text if isinstance(text, str) else ""
    history: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        history["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name or "", "arguments": c.arguments}}
            for c in calls
        ]
    logprobs = None
    content_logprobs = (
        (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
    )
    if isinstance(content_logprobs, list) and content_logprobs:
        logprobs = [float(item.get("logprob", 0.0)) for item in content_logprobs]
    counts = response.get("usage")
    usage: dict[str, Any] = counts if isinstance(counts, dict) else {}
    return Completion(
        content=content,
        tool_calls=calls,
        finish_reason=str(choice.get("finish_reason") or "stop"),
        message=history,
        reasoning=reasoning if isinstance(reasoning, str) else None,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(usage.get("completion_tokens") or 0),
        prompt_ids=int_list(response.get("prompt_token_ids")),
        completion_ids=int_list(choice.get("token_ids")),
        logprobs=logprobs,
    )


def int_list(value: object) -> list[int] | None:
    """``value`` itself when it is a list of ints (bools excluded), else None."""
    if isinstance(value, list) and set(map(type, value)) <= {int}:
        return value
    return None


def json_body(raw: bytes, describe: str) -> dict[str, Any]:
    """A response body as JSON; anything else (an HTML page, a torn body) is a ``ModelError``."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ModelError(f"{describe}: the reply is not JSON") from None
    if not isinstance(data, dict):
        raise ModelError(f"{describe}: the reply is not a JSON object")
    return data
