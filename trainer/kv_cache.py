"""The torch sampler's key/value cache: each episode's prefix is computed once, and every later
forward runs only the tokens appended since (the sampled token, or an observation).

``PrefixCache`` keeps, per cached sequence, each attention layer's keys and values and (with
routing) the experts each position was routed to. A request reuses the longest cached sequence that
is a prefix of its ids, so episodes need no handle. ``cached_next_token_logprobs`` runs one batched
forward over the uncached suffixes of several requests, each row with its own cached prefix, and
caches every row's whole sequence.

Guarantees (tests/trainer/test_kv_cache.py): the log-probs equal a full recompute's to float
rounding, whatever is cached and however rows are batched; a forward never computes a cached
position again; ``forget`` drops an ended episode's entries; the cache holds at most ``capacity``
entries (least recently used dropped first). Weights that change make every entry stale: call
``clear``. Only for models whose every layer is full attention (``supports_prefix_cache``); any
other is refused (``UnsupportedPrefixCache``) and ``BatchedSampler`` runs it without the cache.

How rows are padded, and why recurrent layers are not cached: docs/guides/training.md#rollouts-tito."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import nn
from transformers import DynamicCache
from transformers.cache_utils import CacheLayerMixin, DynamicLayer

from termgym.errors import ConfigError

from .routing import record_routing, stack_routing


class UnsupportedPrefixCache(ConfigError):
    """The model has a layer whose cache is not per-position keys and values of full attention."""


def supports_prefix_cache(model) -> bool:
    """Whether ``model``'s every layer caches exactly the full-attention keys and values of the
    positions it read, as transformers lays out its cache for the model's configuration (a
    linear-attention, recurrent, sliding-window or chunked layer, or a model without a config: no)."""
    config = getattr(model, "config", None)
    if config is None:
        return False
    try:
        layers = DynamicCache(config=config).layers
    except (AttributeError, KeyError, TypeError, ValueError):  # a layer type transformers cannot lay out
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


@dataclass
class CacheEntry:
    ids: tuple[int, ...]
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per attention layer: keys, values [heads, len(ids), head_dim]
    routing: torch.Tensor | None  # [len(ids), MoE layers, top_k]: the experts that computed each position


class PrefixCache:
    """Cached sequences, least recently used first."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[int, ...], CacheEntry] = OrderedDict()
        self.hits = 0  # positions served from the cache so far
        self.computed = 0  # positions computed by a forward so far

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int]) -> CacheEntry | None:
        """The longest cached sequence that is a strict prefix of ``ids`` or equal to it (its last
        position is then recomputed: the next token needs its logits)."""
        best: CacheEntry | None = None
        for key, entry in self._entries.items():
            n = len(key)
            if n <= len(ids) and (best is None or n > len(best.ids)) and tuple(ids[:n]) == key:
                best = entry
        if best is not None:
            self._entries.move_to_end(best.ids)
        return best

    def store(self, entry: CacheEntry, replaces: CacheEntry | None = None) -> None:
        """Cache ``entry``; ``replaces`` (the prefix it extends) is dropped, since its episode has
        moved on."""
        if replaces is not None and replaces.ids != entry.ids:
            self._entries.pop(replaces.ids, None)
        self._entries[entry.ids] = entry
        self._entries.move_to_end(entry.ids)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def forget(self, ids: Sequence[int]) -> None:
        """Drop every entry that is a prefix of ``ids`` (an ended episode's)."""
        for key in [k for k in self._entries if len(k) <= len(ids) and tuple(ids[: len(k)]) == k]:
            del self._entries[key]

    def clear(self) -> None:
        self._entries.clear()


def _attention_layers(past: DynamicCache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    layers = []
    for layer in past.layers:  # attention layers, each filled by the forward that returned ``past``
        assert isinstance(layer, CacheLayerMixin) and layer.keys is not None and layer.values is not None
        layers.append((layer.keys, layer.values))
    return layers


def cached_next_token_logprobs(
    model,
    sequences: Sequence[Sequence[int]],
    cache: PrefixCache,
    pad_id: int = 0,
    *,
    positions: Sequence[Sequence[int]] | None = None,
    routers: Sequence[nn.Module] | None = None,
) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
    """Log-probabilities of the next token after each sequence (``[len(sequences), vocab]``), from
    one forward over the parts ``cache`` does not hold; every sequence is then cached whole. With
    ``positions`` (per sequence, positions of it), also returns the experts that computed each of
    those positions (``[len(positions[row]), MoE layers, top_k]`` per row, int16), from this
    forward or, for a cached position, from the forward that cached it. Raises
    ``UnsupportedPrefixCache`` for a model ``supports_prefix_cache`` refuses."""
    if not supports_prefix_cache(model):
        raise UnsupportedPrefixCache(
            f"{type(model).__name__}: not every layer is full attention; the prefix key/value cache cannot serve it"
        )
    rows = len(sequences)
    hits = [cache.lookup(seq) for seq in sequences]
    if positions is not None:  # an entry cached without its routing cannot answer for its positions
        hits = [h if h is None or h.routing is not None else None for h in hits]
    # keep at least the last token uncached: its logits are the answer
    past = [min(len(h.ids), len(seq) - 1) if h is not None else 0 for h, seq in zip(hits, sequences)]
    suffix = [list(seq[p:]) for seq, p in zip(sequences, past)]
    width_past, width_new = max(past), max(len(s) for s in suffix)
    ids = torch.full((rows, width_new), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width_past + width_new), dtype=torch.long)
    position_ids = torch.zeros((rows, width_new), dtype=torch.long)
    for row, (p, new) in enumerate(zip(past, suffix)):
        ids[row, : len(new)] = torch.tensor(new, dtype=torch.long)
        attention[row, :p] = 1
        attention[row, width_past : width_past + len(new)] = 1
        position_ids[row] = torch.arange(width_new) + p
    stacked = []  # per attention layer: the rows' cached keys and values, padded to width_past
    if width_past and rows == 1:  # one row: its cached keys and values as they are, nothing to pad
        hit = hits[0]
        assert hit is not None  # a cached past is a hit's
        stacked = [(keys[None, :, :width_past], values[None, :, :width_past]) for keys, values in hit.layers]
    elif width_past:
        template = next(h for h, p in zip(hits, past) if p)
        assert template is not None  # a row with a cached past has a hit
        for layer, (keys, values) in enumerate(template.layers):
            k = keys.new_zeros((rows, keys.shape[0], width_past, keys.shape[2]))
            v = values.new_zeros((rows, values.shape[0], width_past, values.shape[2]))
            for row, (hit, p) in enumerate(zip(hits, past)):
                if p:
                    assert hit is not None  # a cached past is a hit's
                    k[row, :, :p], v[row, :, :p] = hit.layers[layer][0][:, :p], hit.layers[layer][1][:, :p]
            stacked.append((k, v))
    recording = record_routing(model, routers) if positions is not None else nullcontext([])
    with torch.no_grad(), recording as per_layer:
        out = model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=position_ids,
            past_key_values=DynamicCache(ddp_cache_data=stacked) if stacked else DynamicCache(),
            use_cache=True,
        )
    new_routing = stack_routing(per_layer, rows, width_new) if positions is not None else None
    layers = _attention_layers(out.past_key_values)
    routed: list[torch.Tensor] | None = [] if positions is not None else None
    for row, (seq, hit, p, new) in enumerate(zip(sequences, hits, past, suffix)):
        if rows == 1:  # no padding: the row's keys and values are the forward's whole
            kept = [(k[0], v[0]) for k, v in layers]
        else:
            kept = [
                (
                    torch.cat((k[row, :, :p], k[row, :, width_past : width_past + len(new)]), dim=1),
                    torch.cat((v[row, :, :p], v[row, :, width_past : width_past + len(new)]), dim=1),
                )
                for k, v in layers
            ]
        routing = None
        if new_routing is not None:
            assert positions is not None and routed is not None  # all three are set together
            if p:
                assert hit is not None and hit.routing is not None  # with positions, only hits with routing count
                earlier = hit.routing[:p]
            else:
                earlier = new_routing.new_empty((0, *new_routing.shape[2:]))
            routing = torch.cat((earlier, new_routing[row, : len(new)]))
            routed.append(routing[list(positions[row])].clone())
        cache.store(CacheEntry(tuple(seq), kept, routing), replaces=hit)
    cache.hits += sum(past)
    cache.computed += sum(len(s) for s in suffix)
    last = torch.tensor([len(s) - 1 for s in suffix])
    return torch.log_softmax(out.logits[torch.arange(rows), last].float(), dim=-1), routed
