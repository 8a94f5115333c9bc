"""HTTP to an OpenAI-compatible model server through the official async ``openai`` SDK: where the
server is (``Endpoint``), one SDK client and context window per server (``Server``), and one
bounded request (``call``). The chat client (``termgym.agents.chat``), the tokens client
(``termgym.agents.tokens``), the audit's judge and the trainer's server sampler all go through it.

Guaranteed: 408, 409, 429 (honouring ``Retry-After``), 5xx, connection errors and timeouts are
retried by the SDK (``max_retries``, exponential backoff with jitter); each attempt is bounded by
``request_timeout`` and the whole request by the caller's deadline (``AgentDeadline`` after it).
What is still failing after that is a ``ModelError`` with a one-line message, raised from the
SDK's exception; a 400 that says the prompt is too long is ``ContextExceeded``, with the prompt's
length when the server's message gives it. A body that is not a JSON object is a ``ModelError``.
Bodies are read raw, not through the SDK's typed objects (``post``, ``json_body``). Not
guaranteed: that a server accepts vLLM's extra request fields; callers drop what a server rejects
(``rejected_field``). The SDK is imported on first use, so termgym imports without it.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from termgym.errors import AgentDeadline, ConfigError, ContextExceeded, ModelError

DEFAULT_REQUEST_TIMEOUT = 600.0
DEFAULT_MAX_RETRIES = 4
# vLLM: "your prompt contains [at least] N input tokens", "max_tokens=M cannot be greater than
# max_model_len=W"; OpenAI: "you requested T tokens (N in the messages, M in the completion)".
_PROMPT_LENGTH = re.compile(
    r"contains (?:at least )?(\d+) input tokens|(\d+) in the messages|request has (\d+) input tokens"
)
_CONTEXT_ERROR = re.compile(
    r"maximum context length|context length|context_length_exceeded|too many tokens|greater than max_model_len", re.I
)


@dataclass(frozen=True)
class Endpoint:
    """Where the model is served and how to authenticate. ``api_key``: the key itself, read from the
    variable the user names by ``resolve_api_key`` (None: no key, as a local vLLM server needs none)."""

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
            said = f"{describe}: {message}"
            raise ContextExceeded(said, prompt_tokens=prompt_length(said)) from exc
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


def prompt_length(message: str) -> int | None:
    """The prompt's length in tokens when a context-length error's ``message`` says it (vLLM's and
    OpenAI's wordings), else None."""
    found = _PROMPT_LENGTH.search(message)
    return int(next(g for g in found.groups() if g)) if found else None


def _error_message(exc: Any) -> str:
    said = envelope_message(getattr(exc, "body", None))
    return said if said is not None else " ".join(str(getattr(exc, "message", exc)).split())[:500]


def rejected_field(exc: BaseException, fields: Sequence[str]) -> str | None:
    """The optional request field a 400 complains about, if it names one of ``fields``."""
    cause = exc.__cause__
    return named_field(_error_message(cause) if cause is not None else str(exc), fields)


def named_field(message: str, fields: Sequence[str]) -> str | None:
    """The first of ``fields`` that ``message`` names as a whole word (a complaint about
    ``top_logprobs`` is not one about ``logprobs``)."""
    return next((name for name in fields if re.search(rf"\b{re.escape(name)}\b", message)), None)


def envelope_message(body: object, limit: int = 500) -> str | None:
    """The message of an error body in the OpenAI envelope (``{"error": {"message"}}``) or a bare
    ``{"message"}``, on one line and cut at ``limit`` characters; None when it has none."""
    if not isinstance(body, dict):
        return None
    inner = body.get("error", body)
    if isinstance(inner, dict) and inner.get("message"):
        return " ".join(str(inner["message"]).split())[:limit]
    if isinstance(body.get("message"), str):
        return " ".join(body["message"].split())[:limit]
    return None


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
    """One model server as every client uses it: the SDK client (made on first use) and the context
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
