"""The server sampler (``--generator server``): turns sampled by a running ``vllm serve`` over HTTP,
one ``POST /v1/completions`` per turn with the episode's token ids as the prompt, and the trainer's
weights published into that server once per PPO step, without a restart (``trainer/publication.py``).

It implements the ``Sampler`` protocol (``trainer/sampler.py``). HTTP goes through the model
agent's transport (``termgym.agents.transport``) on an event loop of the sampler's own (a daemon thread),
so the synchronous ``publish`` and the constructor can talk to the server while the rollout's loop
runs, and turns can be awaited from any loop.

Guaranteed, in short: the returned ids are the server's ``token_ids`` unchanged, one turn each (a
reply that is not is a ``ModelError``, never trained on); every request sets all its sampling
parameters; a publication waits for the turns in flight and holds new ones, so no turn mixes two
versions; the constructor checks the server (reachable, the model, its context, dev mode, the
worker extension, log-prob output) in one line each. Routed experts are not asked for (R3 is off).
How to start the server, why weights go in this way, and each guarantee in full: "The server
generator" in docs/guides/training.md.
"""

from __future__ import annotations

import asyncio
import math
import os
import shutil
import threading
import time
import weakref
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any, TypeVar
from urllib.parse import urlparse

import torch

from termgym.agents.transport import (
    DEFAULT_MAX_RETRIES,
    DEFAULT_REQUEST_TIMEOUT,
    Endpoint,
    Server,
    call,
    int_list,
    json_body,
    post,
)
from termgym.errors import AgentDeadline, ConfigError, ContextExceeded, ModelError, TrainingError

from .publication import (
    LOAD_METHOD,
    PUBLICATION_TOLERANCE,
    WORKER_EXTENSION,
    WORKER_EXTENSIONS,
    WeightPublisher,
)
from .routing import routing_shape
from .sampler import TurnResult

T = TypeVar("T")

LOGPROB_MODES = ("processed_logprobs", "raw_logprobs")  # the same at temperature 0 and 1; *_logits are not log-probs
SEED_BOUND = 2**31 - 1  # per-request seeds drawn below it
ROUTING_NOTE = (
    "routed experts unavailable: the server generator does not get them from vLLM's HTTP server "
    "(vLLM returns them only from its GPU model runner); R3 is off for this run"
)
SERVER_FLAGS = (
    f"VLLM_SERVER_DEV_MODE=1 vllm serve DIR --worker-extension-cls {WORKER_EXTENSION} "
    "--logprobs-mode processed_logprobs"
)


def root_url(base_url: str) -> str:
    """The server's root from its OpenAI base URL (``http://host:port/v1`` -> ``http://host:port``):
    vLLM's development endpoints are not under ``/v1``."""
    parsed = urlparse(base_url.rstrip("/"))
    path = parsed.path[: -len("/v1")] if parsed.path.endswith("/v1") else parsed.path
    return parsed._replace(path=path, params="", query="", fragment="").geturl()


def check_server_info(info: dict[str, Any], where: str) -> None:
    """One line (``ConfigError``) unless ``GET /server_info?config_format=json`` says the server
    loads the worker extension (by its name or its earlier one) and returns log-probs (not logits)."""
    config = info.get("vllm_config")
    if not isinstance(config, dict):
        raise ConfigError(f"{where}: /server_info has no vllm_config (not a vLLM server in dev mode?)")
    extension = (config.get("parallel_config") or {}).get("worker_extension_cls")
    if extension not in WORKER_EXTENSIONS:
        raise ConfigError(
            f"{where}: the server's worker extension is {extension or 'none'!r}; publishing weights needs "
            f"--worker-extension-cls {WORKER_EXTENSION}"
        )
    mode = (config.get("model_config") or {}).get("logprobs_mode")
    if mode not in LOGPROB_MODES:
        raise ConfigError(
            f"{where}: the server's --logprobs-mode is {mode!r}; the sampler needs log-probs "
            "(--logprobs-mode processed_logprobs)"
        )


def served_prompt_logprobs(response: dict[str, Any], ids: Sequence[int], describe: str) -> torch.Tensor:
    """The log-probs of ``ids[1:]`` in a completion's ``prompt_logprobs`` (a ``ModelError`` if absent)."""
    choices = response.get("choices")
    rows = choices[0].get("prompt_logprobs") if isinstance(choices, list) and choices else None
    if not isinstance(rows, list) or len(rows) != len(ids):
        raise ModelError(f"{describe}: the reply has no prompt log-probs for the {len(ids)} prompt ids")
    values = []
    for row, token in zip(rows[1:], ids[1:]):
        entry = row.get(str(token)) if isinstance(row, dict) else None
        if not isinstance(entry, dict) or not isinstance(entry.get("logprob"), int | float):
            raise ModelError(f"{describe}: the reply has no prompt log-prob for id {token}")
        values.append(float(entry["logprob"]))
    return torch.tensor(values)


def parse_turn(response: dict[str, Any], budget: int, stop_ids: Sequence[int], describe: str) -> TurnResult:
    """A completion's JSON to a turn: the ids as returned, each with its log-prob; a reply that is
    not one turn (no ids, a stop id before the last, an early end without one) is a ``ModelError``."""
    choices = response.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    tokens = int_list(choice.get("token_ids"))
    if not tokens:
        raise ModelError(f"{describe}: the reply has no token ids (the server needs return_token_ids)")
    scores = choice.get("logprobs")
    raw = scores.get("token_logprobs") if isinstance(scores, dict) else None
    if not isinstance(raw, list) or len(raw) != len(tokens):
        raise ModelError(f"{describe}: the reply has {len(tokens)} token ids but no log-prob for each")
    if any(not isinstance(x, int | float) or math.isnan(x) for x in raw):
        raise ModelError(f"{describe}: the reply has a missing log-prob")
    stops = set(stop_ids)
    if stops & set(tokens[:-1]):
        raise ModelError(f"{describe}: the server went on past a stop id: {tokens}")
    if tokens[-1] not in stops and len(tokens) != budget:
        reason = choice.get("finish_reason")
        raise ModelError(
            f"{describe}: the turn ended after {len(tokens)} of {budget} ids without a stop id (finish_reason {reason})"
        )
    return TurnResult(tokens, [float(x) for x in raw])


class ServerSampler(WeightPublisher):
    """A running vLLM server as the rollout's generator. ``model`` is the trainer-side copy of the
    policy (``publish`` loads into it too; the publication check compares against it);
    ``served_model`` is the name the server serves it under (``--served-model-name``), at
    ``base_url`` (``http://host:port/v1``)."""

    records_routing = False
    routing_note = ROUTING_NOTE
    engine_name = "server"

    def __init__(
        self,
        model: torch.nn.Module,
        base_url: str,
        served_model: str,
        *,
        max_context: int = 1024,
        api_key: str | None = None,
        request_timeout: float = DEFAULT_REQUEST_TIMEOUT,
        max_retries: int = DEFAULT_MAX_RETRIES,
        weights_dir: str | os.PathLike | None = None,
        tolerance: float = PUBLICATION_TOLERANCE,
    ) -> None:
        self.endpoint = Endpoint(
            base_url, served_model, api_key=api_key, request_timeout=request_timeout, max_retries=max_retries
        )
        self.root_url = root_url(base_url)
        self.max_context = max_context
        self.routing_shape = routing_shape(model)
        self.forwards = 0  # completion requests answered (the server batches them itself)
        self.requests = 0  # turn requests served (one completion each)
        self.max_model_len: int | None = None  # the server's context window (from GET /v1/models)
        super().__init__(
            model, tolerance=tolerance, scratch_prefix="termgym-server-weights-", scratch_parent=weights_dir
        )
        self.server = Server(self.endpoint)  # its SDK client lives on the sampler's own loop
        self._in_flight = 0
        self._publishing = False
        self._gate = asyncio.Condition()  # used on the sampler's loop only
        self._loop: asyncio.AbstractEventLoop | None = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="termgym-server-sampler", daemon=True)
        self._thread.start()
        # a sampler dropped without close still stops its loop and removes its scratch directory
        self._finalizer = weakref.finalize(self, _shutdown, self._loop, self._thread, self._weights_dir)
        try:
            self._run(self._check_server())
        except BaseException:
            self.close()
            raise

    # -- the server ------------------------------------------------------------------------------

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        """Run ``coroutine`` on the sampler's loop and wait for it (from any other thread)."""
        if self._loop is None:
            coroutine.close()
            raise RuntimeError("the server sampler is closed")
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def _deadline(self) -> float:
        """A bound on one request, retries included (each attempt has the request timeout)."""
        endpoint = self.endpoint
        return time.monotonic() + endpoint.request_timeout * (endpoint.max_retries + 1) + 60

    async def _ask(self, request: Awaitable[Any], describe: str) -> dict[str, Any]:
        try:
            return json_body(await call(request, self._deadline(), describe), describe)
        except AgentDeadline as exc:
            raise ModelError(str(exc)) from None

    async def _post(self, path: str, body: dict[str, Any], describe: str, *, root: bool = False) -> dict[str, Any]:
        """``POST path`` under the base URL (``/completions``), or under the server's root with
        ``root`` (the development endpoints: ``/collective_rpc``)."""
        url = self.root_url + path if root else path
        return await self._ask(post(self.server.sdk, url, body), f"{self.root_url} {describe}")

    async def _get(self, path: str, describe: str, *, root: bool = False) -> dict[str, Any]:
        url = self.root_url + path if root else path
        return await self._ask(self.server.sdk.get(url, cast_to=bytes), f"{self.root_url} {describe}")

    async def _dev(self, coroutine: Awaitable[T], endpoint: str) -> T:
        """``coroutine``, with a 404 (dev endpoints not mounted) said as the flag that mounts them."""
        import openai

        try:
            return await coroutine
        except ModelError as exc:
            if isinstance(exc.__cause__, openai.NotFoundError):
                raise ConfigError(
                    f"{self.root_url} has no {endpoint}: start the server with VLLM_SERVER_DEV_MODE=1 ({SERVER_FLAGS})"
                ) from None
            raise

    async def _check_server(self) -> None:
        where = self.root_url
        try:
            page = await self._get("/models", "GET /models")
        except ModelError as exc:
            raise ModelError(f"the generator's vLLM server is not reachable: {exc}") from exc
        entries = [e for e in page.get("data") or [] if isinstance(e, dict)]
        served = [str(e.get("id")) for e in entries]
        entry = next((e for e in entries if e.get("id") == self.endpoint.model), None)
        if entry is None:
            raise ConfigError(f"{where} serves {served}, not {self.endpoint.model!r} (its --served-model-name)")
        window = entry.get("max_model_len")
        if not isinstance(window, int):
            raise ConfigError(f"{where}: GET /v1/models does not say {self.endpoint.model!r}'s max_model_len")
        if window < self.max_context:
            raise ConfigError(
                f"{where} serves {self.endpoint.model!r} with a context of {window} tokens, shorter than the "
                f"trainer's max_context {self.max_context} (start it with --max-model-len {self.max_context}, "
                f"or give the trainer --max-context {window})"
            )
        self.max_model_len = window
        info = await self._dev(
            self._get("/server_info?config_format=json", "GET /server_info", root=True), "/server_info"
        )
        check_server_info(info, where)

    # -- sampling ------------------------------------------------------------------------------

    def forget(self, ids: Sequence[int]) -> None:
        """Nothing is kept per episode (the server's prefix cache evicts on its own)."""

    async def generate_turn(
        self,
        ids: Sequence[int],
        max_new_tokens: int,
        stop_ids: Sequence[int],
        generator: torch.Generator | None,
        positions: Sequence[int] = (),
    ) -> TurnResult:
        """Sample one turn after ``ids``: up to ``max_new_tokens`` ids (fewer if the server's
        context leaves less room), ending with the first of ``stop_ids`` if one is sampled.
        ``generator`` None: greedy; otherwise temperature 1 with a seed drawn from it. ``positions``
        is unused (no routing is recorded)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, not {max_new_tokens}")
        if self._loop is None:
            raise RuntimeError("the server sampler is closed")
        prompt = [int(i) for i in ids]
        budget = max_new_tokens if self.max_model_len is None else min(max_new_tokens, self.max_model_len - len(prompt))
        if budget < 1:
            raise ContextExceeded(f"the prompt has {len(prompt)} tokens: no room left in {self.max_model_len}")
        body: dict[str, Any] = {
            "model": self.endpoint.model,
            "prompt": prompt,
            "max_tokens": budget,
            "temperature": 0.0 if generator is None else 1.0,
            # the request sets every sampling parameter: the server's generation-config defaults do not apply
            "top_p": 1.0,
            "top_k": 0,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "presence_penalty": 0.0,
            "frequency_penalty": 0.0,
            "ignore_eos": True,  # only stop_ids end a turn
            "stop_token_ids": [int(s) for s in stop_ids],
            "logprobs": 1,
            "return_token_ids": True,
            "skip_special_tokens": False,
        }
        if generator is not None:
            body["seed"] = int(torch.randint(0, SEED_BOUND, (1,), generator=generator))
        loop = self._loop
        future = asyncio.run_coroutine_threadsafe(self._turn(body, budget, tuple(body["stop_token_ids"])), loop)
        return await asyncio.wrap_future(future)

    async def _turn(self, body: dict[str, Any], budget: int, stop_ids: tuple[int, ...]) -> TurnResult:
        async with self._gate:  # a publication in progress holds new turns
            await self._gate.wait_for(lambda: not self._publishing)
            self._in_flight += 1
        try:
            describe = "completion"
            response = await self._post("/completions", body, describe)
            turn = parse_turn(response, budget, stop_ids, f"{self.root_url} {describe}")
            self.forwards, self.requests = self.forwards + 1, self.requests + 1
            return turn
        finally:
            async with self._gate:
                self._in_flight -= 1
                self._gate.notify_all()

    # -- weights ---------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._loop is None:
            raise RuntimeError("the server sampler is closed")

    def _load_weights(self, path: str, version: int) -> torch.Tensor:
        """Once the turns in flight have finished, the server loads ``path``, drops its prefix cache
        and records ``version`` (``WeightPublisher.publish``); turns requested meanwhile are served
        after it, under the new weights."""
        return self._run(self._publish(path, version))

    async def _publish(self, path: str, version: int) -> torch.Tensor:
        async with self._gate:
            self._publishing = True
            await self._gate.wait_for(lambda: self._in_flight == 0)
        try:
            body = {"method": LOAD_METHOD, "args": [path]}
            try:
                answer = await self._dev(
                    self._post("/collective_rpc", body, "weight load", root=True), "/collective_rpc"
                )
            except ModelError as exc:
                if LOAD_METHOD in str(exc) and "attribute" in str(exc):
                    raise ConfigError(
                        f"{self.root_url}: the server's workers have no {LOAD_METHOD} (start it with "
                        f"--worker-extension-cls {WORKER_EXTENSION})"
                    ) from None
                raise
            loaded = answer.get("results")
            if not isinstance(loaded, list) or not loaded or not all(str(n).isdigit() and int(n) > 0 for n in loaded):
                raise TrainingError(
                    f"{self.root_url}: the weight load answered {loaded!r}, not a tensor count per worker"
                )
            await self._reset_prefix_cache()
            await self._post("/update_weight_version", {"new_version": str(version)}, "weight version", root=True)
            return await self._prompt_logprobs(self.probe_ids)
        finally:
            async with self._gate:
                self._publishing = False
                self._gate.notify_all()

    async def _reset_prefix_cache(self, attempts: int = 20) -> None:
        """Drop the server's prefix cache (KV from the old weights); vLLM refuses while blocks are
        held (another client's requests), so it is asked again for a while."""
        for _ in range(attempts):
            answer = await self._post("/reset_prefix_cache", {}, "prefix cache reset", root=True)
            if answer.get("success"):
                return
            await asyncio.sleep(0.25)
        raise TrainingError(f"{self.root_url}: the server would not reset its prefix cache after the weight load")

    async def _prompt_logprobs(self, ids: Sequence[int]) -> torch.Tensor:
        body = {
            "model": self.endpoint.model,
            "prompt": list(ids),
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
            "return_token_ids": True,
        }
        describe = "prompt log-probs"
        response = await self._post("/completions", body, describe)
        return served_prompt_logprobs(response, ids, f"{self.root_url} {describe}")

    def prompt_logprobs(self, ids: Sequence[int]) -> torch.Tensor:
        """The server's log-probability of ``ids[1:]``, each given the ids before it."""
        return self._run(self._prompt_logprobs(list(ids)))

    def served_version(self) -> str:
        """The weight version the server reports (``GET /weight_info``; ``default`` before any publication)."""
        answer = self._run(self._get("/weight_info", "GET /weight_info", root=True))
        return str(answer.get("weight_version"))

    # -- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Close the HTTP client and stop the sampler's loop (idempotent). The server keeps running."""
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.server.aclose(), loop).result(timeout=30)
        except Exception:  # closing: a client that will not close is dropped
            pass
        finally:
            self._finalizer()

    async def aclose(self) -> None:
        """``close`` from a coroutine (without blocking its loop)."""
        await asyncio.to_thread(self.close)

    def __enter__(self) -> ServerSampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shutdown(loop: asyncio.AbstractEventLoop, thread: threading.Thread, weights_dir: str) -> None:
    """Stop the sampler's loop and its thread, and remove its scratch directory."""
    if not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)
    if thread is not threading.current_thread():  # dropped by a coroutine of its own loop: it just stops
        thread.join(timeout=30)
    if not thread.is_alive() and not loop.is_closed():
        loop.close()
    shutil.rmtree(weights_dir, ignore_errors=True)
