"""The sampler seam: what the rollout asks of whatever generates the policy's turns.

``Sampler`` is the protocol the rollout drives (``trainer/rollout.py``) and the PPO loop publishes
weights into (``trainer/ppo.py``). Three implement it: ``BatchedSampler`` here (torch: one batched
forward per round of next-token requests, over a key/value cache, ``trainer/kv_cache.py``),
``VllmSampler`` (``trainer/vllm_sampler.py``: a vLLM engine sampling whole turns) and
``ServerSampler`` (``trainer/server_sampler.py``: a running ``vllm serve``); the last two publish
weights through ``trainer/publication.py``.
``TokenSampler`` builds whole turns from one-token requests, for ``BatchedSampler`` and for any
sampler that can only say the next token (the tests' scripted ones).

Guaranteed by every sampler: ``generate_turn`` returns the sampled ids unchanged, ending at the
first stop id or after ``max_new_tokens``; each log-prob is the sampler's log-probability of that id
under the full distribution; ``generator=None`` samples greedily; ``close`` releases what the sampler
holds (engine processes, connections, caches) and may be called again. With ``records_routing``, the
turn's ``routing`` maps each of ``positions`` (the episode's sampled positions no forward has read
yet) and every sampled id but the last to the ``[layers, top_k]`` expert ids of the forward that
read it.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Protocol

import torch

from .batch import pad_ids
from .kv_cache import PrefixCache, cached_next_token_logprobs, supports_prefix_cache
from .routing import moe_routers, record_routing, routing_shape, stack_routing


@dataclass
class TurnResult:
    """One turn as the sampler sampled it. ``routing`` maps a position of the episode to its
    ``[layers, top_k]`` expert ids (None when routing is not recorded)."""

    tokens: list[int]
    logprobs: list[float]
    routing: dict[int, torch.Tensor] | None = None


class Sampler(Protocol):
    """What generates the policy's turns. ``model`` is the trainer-side copy of the policy the
    sampler serves (a checkpoint's ``policy/`` is written from it); ``forwards`` and ``requests``
    count engine calls and the requests they served; ``publication_gap`` is the largest log-prob
    difference to the trainer's found after the last ``publish`` (None: nothing to compare)."""

    model: torch.nn.Module
    version: int
    forwards: int
    requests: int
    records_routing: bool
    routing_shape: tuple[int, int]
    publication_gap: float | None

    def publish(self, state_dict: dict, version: int) -> None:
        """Serve these weights from now on; what is sampled after it carries ``version``."""
        ...

    def forget(self, ids: Sequence[int]) -> None:
        """The episode whose tokens are ``ids`` has ended: release what the sampler kept for it."""
        ...

    async def generate_turn(
        self,
        ids: Sequence[int],
        max_new_tokens: int,
        stop_ids: Sequence[int],
        generator: torch.Generator | None,
        positions: Sequence[int] = (),
    ) -> TurnResult:
        """Sample one turn after ``ids`` (module docstring)."""
        ...

    def close(self) -> None:
        """Release what the sampler holds; a second call does nothing."""
        ...


class TokenSampler:
    """A whole turn from one-token requests. Subclasses give ``sample_with_routing`` (or, when
    they record no routing, just ``sample``)."""

    records_routing: bool = False
    routing_shape: tuple[int, int] = (0, 0)

    async def sample(self, ids: Sequence[int], generator: torch.Generator | None) -> tuple[int, float]:
        """The next token after ``ids`` and its log-prob (``generator`` None: greedy)."""
        token, logprob, _ = await self.sample_with_routing(ids, generator, ())
        return token, logprob

    async def sample_with_routing(
        self, ids: Sequence[int], generator: torch.Generator | None, positions: Sequence[int]
    ) -> tuple[int, float, torch.Tensor | None]:
        """``sample``, plus the routing of its forward at ``positions`` of ``ids`` (None: not recorded)."""
        token, logprob = await self.sample(ids, generator)
        return token, logprob, None

    def forget(self, ids: Sequence[int]) -> None:
        """Nothing kept per episode."""

    def close(self) -> None:
        """Nothing held."""

    async def generate_turn(
        self,
        ids: Sequence[int],
        max_new_tokens: int,
        stop_ids: Sequence[int],
        generator: torch.Generator | None,
        positions: Sequence[int] = (),
    ) -> TurnResult:
        """Request one token at a time until a stop id or ``max_new_tokens``; each request's forward
        reads the positions no earlier forward read (the turn's ``positions``, then each sampled id)."""
        ids, unread, turn = list(ids), list(positions), TurnResult([], [], {} if self.records_routing else None)
        while len(turn.tokens) < max_new_tokens:
            token, logprob, rows = await self.sample_with_routing(
                ids, generator, unread if self.records_routing else ()
            )
            if turn.routing is not None and rows is not None:
                turn.routing.update(zip(unread, rows))
            unread = [len(ids)]
            ids.append(token)
            turn.tokens.append(token)
            turn.logprobs.append(logprob)
            if token in stop_ids:
                break
        return turn


def next_token_logprobs(
    model, sequences: Sequence[Sequence[int]], pad_id: int = 0, *, routing: list | None = None
) -> torch.Tensor:
    """Log-probabilities of the next token after each sequence, ``[len(sequences), vocab]``, in one
    right-padded forward pass (causal attention: padding after a sequence cannot change it). With a
    ``routing`` list, it receives that forward's expert ids ``[len(sequences), width, layers, top_k]``."""
    ids, attention = pad_ids(sequences, pad_id)
    width = ids.shape[1]
    last = torch.tensor([len(s) - 1 for s in sequences])
    with torch.no_grad(), record_routing(model) if routing is not None else nullcontext([]) as per_layer:
        logits = model(input_ids=ids, attention_mask=attention).logits
    if routing is not None:
        routing.append(stack_routing(per_layer, len(sequences), width))
    return torch.log_softmax(logits[torch.arange(len(sequences)), last].float(), dim=-1)


class BatchedSampler(TokenSampler):
    """The torch sampler: its own copy of the policy's weights (``publish`` replaces them, once per
    step) and one batched forward per round of next-token requests. With ``kv_cache`` (the
    default) each forward runs only the tokens its requests appended since their episode's last
    forward (``trainer/kv_cache.py``); ``forget`` releases an ended episode's cache. A model the
    cache cannot serve (``supports_prefix_cache``: a layer that is not full attention, such as
    Qwen3.5's linear attention) is always run without it: every forward recomputes every position
    (``cache`` is None).

    ``batched=False`` (the trainer's deterministic runs) gives each request a forward of its own,
    over a cache of its own episode's (keyed by its generator; greedy requests share one): a
    forward's floating-point rounding changes with the shape of its batch (CPU matrix products and
    attention round differently for other batch sizes and paddings), and which requests meet in a
    batch is decided by timing, so batched log-probs, routing and, rarely, sampled ids differ
    between two runs of one seed. Alone, a request's numbers depend on its episode's ids only. It
    costs about twice the sampling time of batched forwards on the tiny policy."""

    def __init__(
        self,
        model,
        *,
        pad_id: int = 0,
        record_routing: bool | None = None,
        kv_cache: bool = True,
        batched: bool = True,
    ) -> None:
        self.model, self.pad_id = model.eval(), pad_id
        self.cache = PrefixCache() if kv_cache and supports_prefix_cache(model) else None
        self.batched = batched
        # unbatched: each sampling episode's own cache, gone with its generator (forget could drop another
        # episode's entry that happens to be a prefix of the ended one's ids: a task launched twice)
        self._own_caches: weakref.WeakKeyDictionary[torch.Generator, PrefixCache] = weakref.WeakKeyDictionary()
        self.version = 0
        self.forwards = 0  # batched forward passes so far
        self.requests = 0  # next-token requests served so far
        self.publication_gap: float | None = None  # its copy is the published weights themselves
        self.routers = moe_routers(model)  # read once: publish loads weights, never changes the modules
        self.records_routing = bool(self.routers) if record_routing is None else record_routing  # default: MoE policies
        self.routing_shape = routing_shape(model)  # (MoE layers, top_k)
        self._pending: list[tuple[list[int], torch.Generator | None, asyncio.Future, list[int]]] = []

    def publish(self, state_dict: dict, version: int) -> None:
        """Load the trainer's current weights; trajectories sampled from now on carry ``version``."""
        self.model.load_state_dict(state_dict)
        self.version = version
        if self.cache is not None:
            self.cache.clear()  # computed with the old weights
        self._own_caches.clear()

    def forget(self, ids: Sequence[int]) -> None:
        """The episode that ``ids`` are the tokens of has ended: drop its cached prefixes."""
        if self.cache is not None:
            self.cache.forget(ids)

    def close(self) -> None:
        """Drop every cached prefix (the model's weights stay: ``model`` is still read)."""
        if self.cache is not None:
            self.cache.clear()
        self._own_caches.clear()

    async def sample_with_routing(
        self, ids: Sequence[int], generator: torch.Generator | None, positions: Sequence[int]
    ) -> tuple[int, float, torch.Tensor | None]:
        """``sample``, plus this forward's routing at ``positions`` of ``ids``
        (``[len(positions), layers, top_k]``, int16; None when routing is not recorded)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((list(ids), generator, future, list(positions)))
        if len(self._pending) == 1:
            loop.call_soon(self._serve)  # after every coroutine already runnable has queued its request
        return await future

    def _forward(self, batch: list) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Next-token log-probs of every request, and each request's routing at its positions."""
        if self.batched:
            return self._forward_together(batch, self.cache)
        alone = [self._forward_together([request], self._cache_of(request[1])) for request in batch]
        logprobs = torch.cat([lp for lp, _ in alone])
        routing = [rows[0] for _, rows in alone if rows is not None] if self.records_routing else None
        return logprobs, routing

    def _cache_of(self, generator: torch.Generator | None) -> PrefixCache | None:
        if self.cache is None or generator is None:
            return self.cache
        return self._own_caches.setdefault(generator, PrefixCache(capacity=4))

    def _forward_together(
        self, batch: list, cache: PrefixCache | None
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """One forward over ``batch``'s requests (over ``cache``, unless it is None)."""
        sequences = [p[0] for p in batch]
        if cache is not None:
            positions = [p[3] for p in batch] if self.records_routing else None
            return cached_next_token_logprobs(
                self.model, sequences, cache, self.pad_id, positions=positions, routers=self.routers
            )
        if not self.records_routing:
            return next_token_logprobs(self.model, sequences, self.pad_id), None
        routing: list[torch.Tensor] = []
        logprobs = next_token_logprobs(self.model, sequences, self.pad_id, routing=routing)
        return logprobs, [routing[0][row, p[3]].clone() for row, p in enumerate(batch)]

    def _serve(self) -> None:
        batch, self._pending = [p for p in self._pending if not p[2].cancelled()], []
        if not batch:
            return
        try:
            logprobs, routing = self._forward(batch)
            self.forwards += 1 if self.batched else len(batch)
            self.requests += len(batch)
            for row, (_, generator, future, _) in enumerate(batch):
                if generator is None:
                    token = int(logprobs[row].argmax())
                else:
                    token = int(torch.multinomial(logprobs[row].exp(), 1, generator=generator))
                future.set_result((token, float(logprobs[row, token]), routing[row] if routing is not None else None))
        except Exception as exc:  # a failure fails every request not yet answered, never hangs them
            for _, _, future, _ in batch:
                if not future.done():
                    future.set_exception(exc)
