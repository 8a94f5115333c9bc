"""Real model architectures, dense and MoE (Qwen3, Qwen3-MoE, Qwen3.5-MoE, Llama 3), tiny and random:
each is a normal model directory of its own class and ``model_type``, and every trainer component
works on it: the critic, the batched sampler (its greedy and sampled turns are a no-cache
recompute's, token for token, log-probs within 1e-5; with the prefix cache wherever the cache is
correct, without it for Qwen3.5's linear attention), the training forward (``forward_logp``
reproduces the sampler's log-probs), routing record and replay for the MoE architectures (agreement
1.0, the sampler's log-probs reproduced) and none for the dense ones, the router's auxiliary loss
switched off, and one PPO-like gradient step of policy and critic.

The tokenizers are byte-level BPEs with the special tokens and chat template of each
architecture's chat format (``CHAT_FORMAT``, ``trainer/tokenizer.py``).
"""

from __future__ import annotations

import asyncio
import copy
import json
import random
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config

from termgym.agents.renderers import format_spec
from termgym.errors import ConfigError
from termgym.trainer import losses
from termgym.trainer.architectures import (
    ARCHITECTURE_CLASSES,
    ARCHITECTURE_MODEL_TYPES,
    ARCHITECTURES,
    MOE_ARCHITECTURES,
    build_architecture_model,
    build_architecture_policy,
    parameter_count,
    tiny_architecture_config,
)
from termgym.trainer.batch import forward_logp, pad_ids
from termgym.trainer.kv_cache import (
    PrefixCache,
    UnsupportedPrefixCache,
    cached_next_token_logprobs,
    supports_prefix_cache,
)
from termgym.trainer.routing import (
    NOT_RECORDED,
    ROUTING_DTYPE,
    disable_router_aux_loss,
    is_moe,
    moe_routers,
    replay_routing,
    routing_shape,
)
from termgym.trainer.sampler import BatchedSampler, TokenSampler, next_token_logprobs
from termgym.trainer.tokenizer import train_family_tokenizer

VOCAB = 512
TURNS, MAX_NEW = 2, 7
PROMPT_LENGTHS, OBSERVATION_LENGTHS = (23, 9, 40), (5, 11, 3)
CORPUS = [
    "ls -la /app && cat /app/notes.txt | grep -n error | sort | uniq -c | head -n 5",
    "find /tmp -type f -name '*.log' -exec wc -l {} + 2>/dev/null; echo done",
    'for f in *.csv; do cut -d, -f2 "$f" | sort -u > "${f%.csv}.keys"; done',
    "The file /app/data.json holds 42 records; count the ones whose status is 'ok'.",
] * 20

CHAT_FORMAT = {"qwen3": "chatml", "qwen3-moe": "chatml", "qwen3.5-moe": "qwen-xml", "llama": "llama3"}


def architecture_tokenizer(architecture: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE over ``CORPUS`` with the special tokens and chat template of ``architecture``'s
    chat format."""
    return train_family_tokenizer(CORPUS, CHAT_FORMAT[architecture], VOCAB)


# -- fixtures: one directory, one loaded policy and one set of sampled episodes per architecture -----


@pytest.fixture(scope="module", params=ARCHITECTURES)
def architecture(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def policy_dir(architecture: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_architecture_policy(
        tmp_path_factory.mktemp(architecture), architecture, architecture_tokenizer(architecture), seed=0
    )


@pytest.fixture(scope="module")
def policy(policy_dir: Path):
    """The architecture's policy as the trainer loads it: ``AutoModelForCausalLM``, float32, eval mode."""
    model = AutoModelForCausalLM.from_pretrained(policy_dir, local_files_only=True, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def tokenizer(policy_dir: Path):
    return AutoTokenizer.from_pretrained(policy_dir, local_files_only=True)


@dataclass
class Episode:
    """What the sampler returned over an episode's turns: ``ids`` (prompt, turns, observations),
    the positions of the sampled ids, their log-probs and the recorded routing by position."""

    ids: list[int]
    sampled: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    routing: dict[int, torch.Tensor] | None = None


def prompts_and_observations(tokenizer) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(0)
    first = len(tokenizer.all_special_ids)  # the specials are the first ids
    bos = [tokenizer.bos_token_id] if tokenizer.bos_token_id is not None else []

    def text(n: int) -> list[int]:
        return [rng.randrange(first, len(tokenizer)) for _ in range(n)]

    return [bos + text(n) for n in PROMPT_LENGTHS], [text(n) for n in OBSERVATION_LENGTHS]


def run_episodes(sampler: TokenSampler, tokenizer, *, greedy: bool) -> list[Episode]:
    """Concurrent episodes of ``TURNS`` turns, an observation between turns; each turn's
    ``positions`` are the episode's sampled positions no forward has read yet."""
    prompts, observations = prompts_and_observations(tokenizer)

    async def one(i: int) -> Episode:
        generator = None if greedy else torch.Generator().manual_seed(i)
        episode, unread = Episode(list(prompts[i])), []
        for turn in range(TURNS):
            result = await sampler.generate_turn(episode.ids, MAX_NEW, [tokenizer.eos_token_id], generator, unread)
            episode.sampled += range(len(episode.ids), len(episode.ids) + len(result.tokens))
            episode.logprobs += result.logprobs
            episode.ids += result.tokens
            if result.routing is not None:
                episode.routing = {**(episode.routing or {}), **result.routing}
            unread = [len(episode.ids) - 1]  # the last sampled id: read by the next turn's first forward
            if turn + 1 < TURNS:
                episode.ids += observations[i]
        sampler.forget(episode.ids)
        return episode

    async def all_of_them() -> list[Episode]:
        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))

    return asyncio.run(all_of_them())


@pytest.fixture(scope="module")
def sampled(policy, tokenizer):
    """Per mode ("greedy", "sampled"): the default sampler (the cache where it is correct) and its
    episodes; "plain": a sampler without the cache, sampling with the same seeds."""
    out = {}
    for mode, kv_cache in (("greedy", True), ("sampled", True), ("plain", False)):
        sampler = BatchedSampler(copy.deepcopy(policy), pad_id=tokenizer.pad_token_id, kv_cache=kv_cache)
        out[mode] = (sampler, run_episodes(sampler, tokenizer, greedy=mode == "greedy"))
    return out


def batch_of(episodes: list[Episode], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``ids``, ``attention``, the loss mask on ``ids[:, 1:]`` (1 on sampled ids) and the sampler's
    log-probs aligned with it."""
    ids, attention = pad_ids([e.ids for e in episodes], pad_id)
    mask, logp = torch.zeros(ids.shape[0], ids.shape[1] - 1), torch.zeros(ids.shape[0], ids.shape[1] - 1)
    for row, e in enumerate(episodes):
        for position, value in zip(e.sampled, e.logprobs):
            mask[row, position - 1], logp[row, position - 1] = 1.0, value
    return ids, attention, mask, logp


def routing_of(episodes: list[Episode], width: int, shape: tuple[int, int]) -> torch.Tensor:
    """The recorded routing as a batch aligned with ``ids`` (``NOT_RECORDED`` elsewhere)."""
    routing = torch.full((len(episodes), width, *shape), NOT_RECORDED, dtype=ROUTING_DTYPE)
    for row, e in enumerate(episodes):
        assert e.routing is not None
        for position, experts in e.routing.items():
            routing[row, position] = experts
    return routing


# -- the directory -----------------------------------------------------------------------------------


def test_each_architecture_is_its_own_tiny_config():
    for architecture in ARCHITECTURES:
        config = tiny_architecture_config(architecture, 1024, pad_id=0, eos_id=2, bos_id=None)
        model = build_architecture_model(config, architecture)
        assert (
            type(model) is ARCHITECTURE_CLASSES[architecture]
            and config.model_type == ARCHITECTURE_MODEL_TYPES[architecture]
        )
        assert 100_000 <= parameter_count(model) < 1_000_000, (architecture, parameter_count(model))
        output = model.get_output_embeddings()
        assert output is not None and output.weight is model.get_input_embeddings().weight  # tied
        assert (config.num_attention_heads, config.num_key_value_heads) == (4, 2)  # grouped-query attention
        assert (config.pad_token_id, config.eos_token_id, config.bos_token_id) == (0, 2, None)
        assert is_moe(model) is (architecture in MOE_ARCHITECTURES)
        if architecture in MOE_ARCHITECTURES:
            assert routing_shape(model) == (config.num_hidden_layers, 2)  # every layer sparse, top-2
            assert {r.num_experts for r in moe_routers(model)} == {4}
            assert config.router_aux_loss_coef == 0.0 and config.output_router_logits is False
    llama = tiny_architecture_config("llama", 1024, pad_id=0, eos_id=2, bos_id=1)
    assert llama.rope_parameters is not None and llama.rope_parameters["rope_theta"] == 500_000.0
    qwen3_5 = tiny_architecture_config("qwen3.5-moe", 1024, layers=4, pad_id=0, eos_id=2, bos_id=None)
    assert qwen3_5.layer_types == ["linear_attention"] * 3 + ["full_attention"]  # Qwen3.5's hybrid pattern
    assert tiny_architecture_config("qwen3.5-moe", 1024, pad_id=0, eos_id=2, bos_id=None).layer_types == [
        "linear_attention",
        "full_attention",
    ]
    with pytest.raises(ConfigError, match="unknown model architecture"):
        tiny_architecture_config("gpt2", 1024, pad_id=0, eos_id=2, bos_id=None)


def test_the_directory_loads_as_the_architecture_with_its_tokenizer(
    architecture, policy_dir, policy, tokenizer, tmp_path
):
    config = json.loads((policy_dir / "config.json").read_text())
    assert config["model_type"] == ARCHITECTURE_MODEL_TYPES[architecture]  # what a renderer is detected from
    assert config["architectures"] == [ARCHITECTURE_CLASSES[architecture].__name__]
    assert type(policy) is ARCHITECTURE_CLASSES[architecture]
    spec = format_spec(CHAT_FORMAT[architecture])
    assert (tokenizer.pad_token, tokenizer.bos_token, tokenizer.eos_token) == (spec.pad, spec.bos, spec.eos)
    assert (config["pad_token_id"], config["eos_token_id"], config["bos_token_id"]) == (
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        tokenizer.bos_token_id,
    )
    assert config["vocab_size"] == len(tokenizer)
    text = "grep -c ok /app/data.json"
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    # the same seed, the same weights; another seed, others
    again = build_architecture_policy(tmp_path / "again", architecture, tokenizer, seed=0)
    other = build_architecture_policy(tmp_path / "other", architecture, tokenizer, seed=1)
    load = AutoModelForCausalLM.from_pretrained
    same, different = load(again).state_dict(), load(other).state_dict()
    for name, tensor in policy.state_dict().items():
        assert torch.equal(tensor, same[name]), name
    assert any(not torch.equal(tensor, different[name]) for name, tensor in policy.state_dict().items())


def test_the_critic_is_the_policy_backbone_with_a_value_head(policy_dir, policy, tokenizer):
    from termgym.trainer.models import Critic

    critic = Critic(policy_dir)
    backbone = dict(critic.backbone.named_parameters())
    for name, parameter in policy.model.named_parameters():
        assert torch.equal(parameter, backbone[name]), name
    ids, attention = pad_ids([[5, 9, 14, 30, 7], [5, 8]], tokenizer.pad_token_id)
    values = critic(ids, attention)
    assert values.shape == ids.shape and torch.equal(values, torch.zeros_like(values))  # the head starts at zero
    with torch.no_grad():
        critic.value_head.weight.fill_(1.0)
    values = critic(ids, attention)
    assert torch.isfinite(values).all() and values[0].unique().numel() == ids.shape[1]  # one value per state


# -- the sampler -------------------------------------------------------------------------------------


def test_the_prefix_cache_serves_exactly_the_full_attention_architectures(architecture, policy, sampled):
    full_attention = architecture != "qwen3.5-moe"
    assert supports_prefix_cache(policy) is full_attention
    for mode in ("greedy", "sampled"):
        sampler, _ = sampled[mode]
        if full_attention:
            assert sampler.cache is not None and sampler.cache.hits > 0  # prefixes were reused
            assert len(sampler.cache) == 0  # every episode forgotten
        else:
            assert sampler.cache is None  # the recurrent layers run without it
    if not full_attention:
        with pytest.raises(UnsupportedPrefixCache):
            cached_next_token_logprobs(policy, [[5, 6, 7]], PrefixCache())
    sliding = Qwen3Config(num_hidden_layers=2, use_sliding_window=True, sliding_window=8, max_window_layers=0)
    assert not supports_prefix_cache(types.SimpleNamespace(config=sliding))
    assert not supports_prefix_cache(torch.nn.Linear(2, 2))  # no config: nothing to lay a cache out from


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_sampled_turns_are_a_no_cache_recompute_token_for_token(mode, policy, tokenizer, sampled):
    _, episodes = sampled[mode]
    prefixes = [(e.ids[:position], e.ids[position]) for e in episodes for position in e.sampled]
    assert all(len(e.sampled) >= TURNS for e in episodes)  # at least one id a turn
    recomputed = next_token_logprobs(policy, [p for p, _ in prefixes], tokenizer.pad_token_id)
    wanted = torch.tensor([float(recomputed[row, token]) for row, (_, token) in enumerate(prefixes)])
    got = torch.tensor([value for e in episodes for value in e.logprobs])
    assert torch.allclose(got, wanted, rtol=0, atol=1e-5), float((got - wanted).abs().max())
    if mode == "greedy":
        assert [token for _, token in prefixes] == recomputed.argmax(-1).tolist()
    else:  # the same seeds without the cache sample the same ids
        _, plain = sampled["plain"]
        assert [e.ids for e in episodes] == [e.ids for e in plain]


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_the_training_forward_reproduces_the_samplers_logprobs(mode, policy, tokenizer, sampled):
    _, episodes = sampled[mode]
    ids, attention, mask, sampler_logp = batch_of(episodes, tokenizer.pad_token_id)
    with torch.no_grad():
        logp, _ = forward_logp(policy, ids, attention)
    gap = ((logp - sampler_logp).abs() * mask).max()
    assert float(gap) <= 1e-5


# -- routing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["greedy", "sampled"])
def test_moe_routing_is_recorded_and_replayed_dense_routing_is_not(mode, architecture, policy, tokenizer, sampled):
    sampler, episodes = sampled[mode]
    ids, attention, mask, sampler_logp = batch_of(episodes, tokenizer.pad_token_id)
    if architecture not in MOE_ARCHITECTURES:
        assert not is_moe(policy) and routing_shape(policy) == (0, 0) and not sampler.records_routing
        assert all(e.routing is None for e in episodes)
        with replay_routing(policy, torch.zeros((*ids.shape, 2, 2), dtype=ROUTING_DTYPE)) as stats:
            forward_logp(policy, ids, attention)
        assert stats.agreement is None and stats.calls == 0  # nothing to patch
        return
    layers, top_k = routing_shape(policy)
    assert is_moe(policy) and sampler.records_routing and (layers, top_k) == (policy.config.num_hidden_layers, 2)
    for e in episodes:
        assert e.routing is not None and sorted(e.routing) == e.sampled[:-1]  # every sampled id a forward read
        assert all(r.shape == (layers, top_k) and r.dtype == ROUTING_DTYPE for r in e.routing.values())
    routing = routing_of(episodes, ids.shape[1], (layers, top_k))
    with torch.no_grad(), replay_routing(policy, routing) as stats:
        logp, _ = forward_logp(policy, ids, attention)
    assert stats.agreement == 1.0 and stats.forced == sum(len(e.sampled) - 1 for e in episodes) * layers
    assert float(((logp - sampler_logp).abs() * mask).max()) <= 1e-5
    # replay is what chose the experts: other recorded experts give other log-probs
    experts = policy.config.num_experts
    other = torch.where(routing >= 0, (routing + 1) % experts, routing).to(ROUTING_DTYPE)
    with torch.no_grad(), replay_routing(policy, other) as stats:
        moved, _ = forward_logp(policy, ids, attention)
    # (the router rarely picks the shifted set itself: a forced layer changes the next one's input)
    assert stats.agreement is not None and stats.agreement < 0.1
    assert float(((moved - sampler_logp).abs() * mask).max()) > 1e-3
    assert all("forward" not in r.__dict__ for r in moe_routers(policy))  # restored


def test_the_router_aux_loss_switches_off(architecture, policy_dir):
    if architecture not in MOE_ARCHITECTURES:  # no router, no such loss: nothing to turn off, nothing added
        model = AutoModelForCausalLM.from_pretrained(policy_dir)
        config = model.config.to_dict()
        disable_router_aux_loss(model)
        assert model.config.to_dict() == config and not hasattr(model, "router_aux_loss_coef")
        return
    model = AutoModelForCausalLM.from_pretrained(policy_dir, router_aux_loss_coef=0.5, output_router_logits=True)
    model.requires_grad_(False)
    ids = torch.tensor([[5, 9, 14, 30, 7, 11, 12]])
    plain = model(input_ids=ids, labels=ids, output_router_logits=False).loss
    balanced = model(input_ids=ids, labels=ids)
    assert balanced.aux_loss is not None and float(balanced.loss) > float(plain) + 1e-3
    disable_router_aux_loss(model)
    assert model.config.output_router_logits is False and model.config.router_aux_loss_coef == 0.0
    assert model(input_ids=ids, labels=ids).aux_loss is None
    asked = model(input_ids=ids, labels=ids, output_router_logits=True)  # asked for: computed, added at 0
    assert asked.aux_loss is not None and torch.equal(asked.loss, plain)


# -- a gradient step -----------------------------------------------------------------------------------


def test_one_ppo_like_step_of_policy_and_critic(architecture, policy_dir, policy, tokenizer, sampled):
    from termgym.trainer.models import Critic

    _, episodes = sampled["sampled"]
    ids, attention, mask, old_logp = batch_of(episodes, tokenizer.pad_token_id)
    routing = routing_of(episodes, ids.shape[1], routing_shape(policy)) if architecture in MOE_ARCHITECTURES else None
    actor, critic = copy.deepcopy(policy), Critic(policy_dir)
    disable_router_aux_loss(actor)
    before = {name: p.detach().clone() for name, p in actor.named_parameters()}
    advantages = torch.where(torch.arange(mask.shape[1]) % 2 == 0, 1.0, -1.0).expand_as(mask) * mask
    with replay_routing(actor, routing) as stats:
        logp, _ = forward_logp(actor, ids, attention)
    assert stats.agreement == (1.0 if routing is not None else None)
    loss, _ = losses.policy_loss(logp, old_logp, advantages, mask)
    loss.backward()
    grads = {name: p.grad for name, p in actor.named_parameters()}
    assert all(g is not None and torch.isfinite(g).all() for g in grads.values())
    for router in moe_routers(actor):  # replay keeps the gate weights differentiable
        weight = router.weight
        assert isinstance(weight, torch.Tensor) and weight.grad is not None and float(weight.grad.abs().sum()) > 0
    if architecture == "qwen3.5-moe":  # gradient through the linear-attention recurrence
        linear = [g for name, g in grads.items() if ".linear_attn." in name]
        assert linear and all(g is not None and float(g.abs().sum()) > 0 for g in linear)
    torch.optim.Adam(actor.parameters(), lr=1e-3).step()
    assert all(torch.isfinite(p).all() for p in actor.parameters())
    assert not torch.equal(before["model.embed_tokens.weight"], actor.model.embed_tokens.weight.detach())
    with torch.no_grad(), replay_routing(actor, routing):
        after, _ = forward_logp(actor, ids, attention)
    assert float(((after - old_logp).abs() * mask).max()) > 1e-4  # the step moved the policy
    values = critic(ids, attention)[:, :-1]
    returns = torch.ones_like(values)
    value_loss = losses.value_loss(values, values.detach(), returns, mask)
    value_loss.backward()
    head = critic.value_head.weight.detach().clone()
    torch.optim.Adam(critic.parameters(), lr=1e-3).step()
    assert float(value_loss.detach()) > 0 and not torch.equal(head, critic.value_head.weight.detach())
