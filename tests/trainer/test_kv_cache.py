"""The sampler's key/value cache: the same log-probs and routing as a full recompute, whatever is
cached and however requests are batched, at a fraction of the positions computed."""

from __future__ import annotations

import asyncio
import random

import torch

from termgym.trainer.kv_cache import PrefixCache, cached_next_token_logprobs
from termgym.trainer.routing import routing_shape
from termgym.trainer.sampler import BatchedSampler, next_token_logprobs


def random_sequences(seed: int, lengths) -> list[list[int]]:
    rng = random.Random(seed)
    return [[1] + [rng.randrange(4, 1000) for _ in range(n - 1)] for n in lengths]


def full_routing(model, sequences) -> list[torch.Tensor]:
    routing: list[torch.Tensor] = []
    next_token_logprobs(model, sequences, routing=routing)
    return [routing[0][row, : len(seq)] for row, seq in enumerate(sequences)]


def test_cached_logprobs_equal_a_full_recompute_whatever_is_cached(tiny_policy):
    model, _ = tiny_policy
    cache = PrefixCache()
    first = random_sequences(0, (30, 12, 45))
    cached_next_token_logprobs(model, first, cache)
    # extended by one token, by many, unchanged (a second sample from the same prompt), and new
    second = [first[0] + [7], first[1] + random_sequences(1, (20,))[0], list(first[2]), random_sequences(2, (17,))[0]]
    before = cache.computed
    logprobs, _ = cached_next_token_logprobs(model, second, cache)
    assert torch.allclose(logprobs, next_token_logprobs(model, second), atol=1e-4)
    # only the uncached tails ran: 1 + 20 + the unchanged sequence's last token + the new one whole
    assert cache.computed - before == 1 + 20 + 1 + 17


def test_a_sampler_with_the_cache_decodes_what_one_without_decodes(tiny_policy):
    model, _ = tiny_policy
    prompts = random_sequences(3, (25, 40, 10))

    async def decode(sampler: BatchedSampler) -> list[list[int]]:
        async def one(i: int, ids: list[int]) -> list[int]:
            generator = torch.Generator().manual_seed(i)
            for _ in range(12):
                token, _ = await sampler.sample(ids, generator)
                ids = [*ids, token]
                if i == 1 and len(ids) == 45:  # an observation arrives mid-episode
                    ids = ids + random_sequences(4, (9,))[0][1:]
            sampler.forget(ids)
            return ids

        return list(await asyncio.gather(*(one(i, list(p)) for i, p in enumerate(prompts))))

    cached, plain = BatchedSampler(model), BatchedSampler(model, kv_cache=False)
    assert asyncio.run(decode(cached)) == asyncio.run(decode(plain))
    cache = cached.cache
    assert cache is not None  # kv_cache is on by default
    assert cache.computed < (cache.hits + cache.computed) / 5  # most positions reused
    assert len(cache) == 0  # every episode forgotten at its end


def test_routing_of_cached_positions_is_the_routing_of_the_forward_that_computed_them(tiny_policy):
    model, _ = tiny_policy
    cache = PrefixCache()
    sequences = random_sequences(5, (20, 33))
    cached_next_token_logprobs(model, sequences, cache, positions=[[], []])
    longer = [sequences[0] + [9, 10, 11], sequences[1] + [12]]
    positions = [[3, 19, 20, 22], [32, 33]]  # cached, cached, new, new / cached, new
    _, routed = cached_next_token_logprobs(model, longer, cache, positions=positions)
    assert routed is not None  # recorded: positions were given
    expected = full_routing(model, longer)
    layers, top_k = routing_shape(model)
    for row, wanted in enumerate(positions):
        assert routed[row].shape == (len(wanted), layers, top_k)
        assert torch.equal(routed[row].sort(-1).values, expected[row][wanted].sort(-1).values)


def test_forget_and_capacity_bound_what_the_cache_holds(tiny_policy):
    model, _ = tiny_policy
    cache = PrefixCache(capacity=2)
    a, b, c = random_sequences(6, (8, 9, 10))
    cached_next_token_logprobs(model, [a], cache)
    cached_next_token_logprobs(model, [[*a, 5]], cache)  # replaces a's entry
    assert len(cache) == 1
    cached_next_token_logprobs(model, [b, c], cache)
    assert len(cache) == 2 and cache.lookup([*a, 5, 6]) is None  # the least recently used went first
    cache.forget([*c, 1, 2])
    assert len(cache) == 1 and cache.lookup(b) is not None


def test_an_unbatched_sampler_gives_an_episode_the_same_bits_whoever_shares_its_rounds(tiny_policy):
    # The deterministic runs' sampler: a batched forward rounds differently with its batch's shape,
    # and which requests meet is timing. Alone, each request's numbers are its episode's alone: the
    # same log-probs, routing and ids whether it runs alone, beside others, or beside an episode
    # of the same prompt that ends (and is forgotten) early.
    model, _ = tiny_policy
    prompt, others = random_sequences(6, (30,))[0], random_sequences(7, (12, 50, 31))

    async def episode(sampler: BatchedSampler, ids: list[int], seed: int, tokens: int):
        generator, got = torch.Generator().manual_seed(seed), []
        for _ in range(tokens):
            token, logprob, routing = await sampler.sample_with_routing(ids, generator, [len(ids) - 1])
            got.append((token, logprob, routing))
            ids = [*ids, token]
            if len(got) == 5:
                ids = ids + others[0][1:7]  # an observation
        sampler.forget(ids)
        return got

    async def run(company: list[tuple[list[int], int, int]]):
        sampler = BatchedSampler(model, batched=False)
        results = await asyncio.gather(episode(sampler, list(prompt), 0, 10), *(episode(sampler, *c) for c in company))
        return results[0], sampler

    alone, _ = asyncio.run(run([]))
    crowded, sampler = asyncio.run(run([(list(prompt), 1, 3), (others[1], 2, 12), (others[2], 3, 6)]))
    assert [(t, lp) for t, lp, _ in alone] == [(t, lp) for t, lp, _ in crowded]  # bit for bit, no tolerance
    assert all(torch.equal(a, b) for (_, _, a), (_, _, b) in zip(alone, crowded))
    assert sampler.forwards == sampler.requests == 10 + 3 + 12 + 6  # a forward per request
