"""Rollout routing replay (R3) for mixture-of-experts policies: record the experts the sampler's
forward chose, and make the training forward use the same experts.

Supported routers: Qwen3-MoE's and Qwen3.5-MoE's ``transformers`` routers and any of the same
shape (softmax over ``hidden @ weight.T``, its top-k, optionally renormalised); the first replayed
call of each router checks that and raises ``UnsupportedRouter`` when it does not match.

Layout of recorded routing: an integer tensor ``[tokens, layers, top_k]`` per sequence (``layers``
counts MoE layers, in model order), ``-1`` in every row that carries no recorded routing; a batch
is ``[batch, time, layers, top_k]`` aligned with ``input_ids``.

``record_routing(model)`` captures each router's top-k ids during a forward, leaving it unchanged.
``replay_routing(model, routing)`` makes a row with recorded ids use exactly those experts, with
gate weights from the *training-side* router's softmax at those ids (so the router still gets
gradient); a row of ``-1`` routes as the model would on its own; ``agreement`` counts how often the
router would have picked the recorded set. The patch is undone on exit, exception or not. Nothing
here changes any parameter or the global random state.
Which routers, in full: docs/guides/training.md#routing-replay-r3."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import SupportsInt, cast

import torch
from torch import nn
from torch.nn import functional as F

from termgym.errors import ConfigError

NOT_RECORDED = -1
ROUTING_DTYPE = torch.int16  # expert ids up to 32767 (Qwen3.5-122B-A10B has 256 experts)


class UnsupportedRouter(ConfigError):
    """The router's forward is not softmax, top-k, optional renormalisation: replay would change it."""


def moe_routers(model: nn.Module) -> list[nn.Module]:
    """The router of every sparse MoE block of ``model``, in model order (empty for a dense model)."""
    routers = []
    for module in model.modules():
        children = dict(module.named_children())
        gate, experts = children.get("gate"), children.get("experts")
        if gate is None or experts is None:
            continue
        weight = getattr(gate, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.dim() == 2 and hasattr(gate, "top_k"):
            routers.append(gate)
    return routers


def _router_weight(router: nn.Module) -> torch.Tensor:
    """A router's ``[num_experts, hidden]`` weight (``moe_routers`` keeps only routers with one)."""
    weight = router.weight
    assert isinstance(weight, torch.Tensor)
    return weight


def _top_k(router: nn.Module) -> int:
    """A router's ``top_k``: a plain attribute, which ``nn.Module``'s typed ``__getattr__`` cannot describe."""
    return int(cast(SupportsInt, router.top_k))


def is_moe(model: nn.Module) -> bool:
    return bool(moe_routers(model))


def routing_shape(model: nn.Module) -> tuple[int, int]:
    """``(layers, top_k)`` of ``model``'s MoE routing."""
    routers = moe_routers(model)
    return len(routers), (_top_k(routers[0]) if routers else 0)


def disable_router_aux_loss(model: nn.Module) -> None:
    """Turn off the MoE load-balancing loss (``output_router_logits``, ``router_aux_loss_coef``)
    in ``model``'s config, and the coefficient the causal-LM classes copy from it when built (a
    forward that asks for the router logits then adds nothing): under replay the routing is
    fixed, so balancing it is meaningless."""
    config = getattr(model, "config", None)
    for name, off in (("output_router_logits", False), ("router_aux_loss_coef", 0.0)):
        if config is not None and hasattr(config, name):
            setattr(config, name, off)
    if isinstance(getattr(model, "router_aux_loss_coef", None), float | int):
        model.router_aux_loss_coef = 0.0  # pyright: ignore[reportArgumentType]  # a float attribute, not a parameter


# -- recording -------------------------------------------------------------------------------------


@contextmanager
def record_routing(model: nn.Module, routers: Sequence[nn.Module] | None = None) -> Iterator[list[torch.Tensor]]:
    """Yield a list that, after a forward, holds each MoE layer's top-k ids ``[rows, top_k]``
    (rows = batch x time, flattened as the block flattens them). One forward per context.
    ``routers``: ``moe_routers(model)`` read once by a caller that records many forwards."""
    routers = moe_routers(model) if routers is None else routers
    captured: list[torch.Tensor | None] = [None] * len(routers)
    out: list[torch.Tensor] = []

    def hook_for(layer: int):
        def hook(module, args, output) -> None:
            captured[layer] = output[2].detach()
            out[:] = [c for c in captured if c is not None]

        return hook

    handles = [router.register_forward_hook(hook_for(i)) for i, router in enumerate(routers)]
    try:
        yield out
    finally:
        for handle in handles:
            handle.remove()


def stack_routing(per_layer: list[torch.Tensor], batch: int, time: int) -> torch.Tensor:
    """``[batch, time, layers, top_k]`` (``ROUTING_DTYPE``) from ``record_routing``'s per-layer rows."""
    return torch.stack([ids.reshape(batch, time, -1) for ids in per_layer], dim=2).to("cpu", ROUTING_DTYPE)


# -- replay ----------------------------------------------------------------------------------------


@dataclass
class ReplayStats:
    """Over every forced (row, layer): how many there were, and in how many the router's own top-k
    set (given that layer's replayed input) equals the recorded set."""

    forced: int = 0
    agreed: int = 0
    calls: int = 0

    @property
    def agreement(self) -> float | None:
        return self.agreed / self.forced if self.forced else None


def _own_routing(router: nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits = F.linear(hidden, _router_weight(router))
    probs = F.softmax(logits, dtype=torch.float, dim=-1)
    _, indices = torch.topk(probs, _top_k(router), dim=-1)
    return logits, probs, indices


def _gate_weights(probs: torch.Tensor, indices: torch.Tensor, normalise: bool, dtype: torch.dtype) -> torch.Tensor:
    scores = probs.gather(-1, indices)
    if normalise:
        scores = scores / scores.sum(dim=-1, keepdim=True)
    return scores.to(dtype)


def _normalisation(router: nn.Module, original, hidden: torch.Tensor) -> bool:
    """Whether ``router`` renormalises its top-k weights, read from its attribute or, failing that,
    from its own output; raises ``UnsupportedRouter`` when neither reading reproduces it."""
    probe = hidden[:8].detach()
    with torch.no_grad():
        want_logits, want_scores, want_indices = original(probe)
        candidates = [bool(router.norm_topk_prob)] if hasattr(router, "norm_topk_prob") else [True, False]
        for normalise in candidates:
            logits, probs, indices = _own_routing(router, probe)
            scores = _gate_weights(probs, indices, normalise, logits.dtype)
            if (
                torch.equal(indices, want_indices)
                and torch.allclose(logits, want_logits)
                and torch.allclose(scores, want_scores, rtol=1e-5, atol=1e-7)
            ):
                return normalise
    raise UnsupportedRouter(
        f"{type(router).__name__}: its forward is not softmax top-k routing; routing replay cannot patch it"
    )


@contextmanager
def replay_routing(model: nn.Module, routing: torch.Tensor | None, *, enforce: bool = True) -> Iterator[ReplayStats]:
    """Within the context, every forward of ``model`` over inputs of shape ``[batch, time]`` takes
    the experts in ``routing`` (``[batch, time, layers, top_k]``; rows of ``-1`` route freely) and
    counts agreement in the yielded ``ReplayStats``. ``enforce=False`` only counts (the forward is
    the model's own). ``routing=None`` or a dense model: nothing is patched."""
    routers = moe_routers(model)
    stats = ReplayStats()
    if routing is None or not routers:
        yield stats
        return
    if routing.dim() != 4 or routing.shape[2] != len(routers):
        raise ValueError(
            f"routing of shape {tuple(routing.shape)} does not fit {len(routers)} MoE layers"
            " ([batch, time, layers, top_k])"
        )
    saved = [router.__dict__.get("forward") for router in routers]

    def patched(layer: int, router: nn.Module):
        original = router.forward  # the bound forward in place now (the class's, or an outer patch)
        per_layer = routing[:, :, layer, :].reshape(-1, routing.shape[-1])
        normalise: list[bool] = []

        def forward(hidden_states: torch.Tensor):
            hidden = hidden_states.reshape(-1, _router_weight(router).shape[1])
            if hidden.shape[0] != per_layer.shape[0]:
                raise ValueError(
                    f"routing has {per_layer.shape[0]} rows for layer {layer}, the forward {hidden.shape[0]}"
                )
            if not normalise:
                normalise.append(_normalisation(router, original, hidden))
            logits, probs, own = _own_routing(router, hidden)
            recorded = per_layer.to(own.device, torch.long)
            forced = recorded[:, 0] >= 0
            with torch.no_grad():
                same = (own.sort(-1).values == recorded.sort(-1).values).all(-1) & forced
                stats.forced += int(forced.sum())
                stats.agreed += int(same.sum())
                stats.calls += 1
            indices = torch.where(forced[:, None], recorded, own) if enforce else own
            return logits, _gate_weights(probs, indices, normalise[0], logits.dtype), indices

        return forward

    try:
        for layer, router in enumerate(routers):
            router.forward = patched(layer, router)
        yield stats
    finally:
        for router, previous in zip(routers, saved):
            if previous is None:
                router.__dict__.pop("forward", None)
            else:
                router.forward = previous
