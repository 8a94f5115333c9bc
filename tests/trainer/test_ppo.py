"""The training loop end to end on the embedded backend: two steps (critic warm-up, then a policy
update) with metrics and a checkpoint, resume bit-for-bit, the CLI, and two processes (gloo)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from termgym.cli import main as termgym_main
from termgym.sandboxes.pacing import default_windows
from termgym.trainer.config import Advantage, Config
from termgym.trainer.metrics import without_timings
from termgym.trainer.models import load_policy
from termgym.trainer.ppo import creation_pacer
from tests.trainer.test_learning import one_thread

TASKS = ["archives/extract-configs", "file-ops/organize-by-extension"]


def tiny_args(out: Path, model: Path, steps: int, *extra: str) -> list[str]:
    return [
        "--preset",
        "tiny-ppo",
        "--model",
        str(model),
        "--out",
        str(out),
        "--steps",
        str(steps),
        "--tasks",
        *TASKS,
        "--batch-size",
        "2",
        "--minibatch-size",
        "2",
        "--concurrency",
        "2",
        "--max-turns",
        "2",
        *extra,
    ]


def metrics_of(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_two_steps_end_to_end_with_warmup_metrics_and_checkpoint(tmp_path, tiny_policy_dir, no_leaks, capsys):
    out = tmp_path / "run"
    assert termgym_main(["train", *tiny_args(out, tiny_policy_dir, 2, "--no-deterministic")]) == 0
    first, second = metrics_of(out)
    assert (first["step"], first["warmup"], second["warmup"]) == (0, True, False)
    for m in (first, second):
        assert m["token_drift"] == 0
        assert m["staleness_max"] == 0
        assert m["logprob_gap"] < 1e-4  # the generator holds this step's weights
        assert m["action_tokens"] > 0 and (m["turns"] > 0 or m["parse_error_rate"] > 0)  # random replies rarely parse
        assert 0.0 <= m["reward"] <= 1.0 and m["value_loss"] is not None and not math.isnan(m["explained_variance"])
        assert m["scheduler"]["kept"] == 2
        assert m["generation_batch_mean"] > 1.0  # the two episodes in flight shared forward passes
        # the episode loop's counts: ChatML keeps every prefix, so each episode is one sample
        assert m["bridge_break_rate"] == 0.0 and m["segments_per_episode"] == 1.0
        assert 0.0 <= m["parse_error_rate"] <= 1.0 and m["context_exhausted"] == 0.0
        assert m["compactions"] == m["compaction_failures"] == 0 and m["policy_versions"] == [m["step"]]
    assert first["policy_loss"] is None and second["policy_loss"] is not None  # warm-up: the critic alone
    assert first["approx_kl"] is None and second["approx_kl"] >= 0.0  # CleanRL's, policy updates only
    assert all(0.0 <= m["equal_reward_share"] <= 1.0 and m["reward_std"] >= 0.0 for m in (first, second))
    assert all(0.0 <= m["equal_reward_families"] <= 1.0 for m in (first, second))
    err = capsys.readouterr().err
    assert "step 2/2 reward" in err
    assert re.search(r"step 1/2 reward .* clip 0\.00 entropy", err)  # the warm-up: no approx_kl
    assert re.search(r"step 2/2 reward .* clip \d\.\d\d kl \d\.\de-\d\d entropy", err)
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    assert state["step"] == 2
    trained, _ = load_policy(out / "policy")  # a normal model directory any tool can load
    start, _ = load_policy(tiny_policy_dir)
    assert any(not torch.equal(a, b) for a, b in zip(trained.state_dict().values(), start.state_dict().values()))
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 4 and {json.loads(line)["policy_version"] for line in lines} == {0, 1}
    assert len((out / "records.jsonl").read_text().splitlines()) == 4


def test_resume_continues_bit_for_bit(tmp_path, tiny_policy_dir, no_leaks):
    # One command per episode: the sandbox's answer to a random command can depend on time (a
    # command that hits its timeout on a loaded machine), and bit-for-bit is about the trainer.
    one_turn = ("--max-turns", "1")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert termgym_main(["train", *tiny_args(straight, tiny_policy_dir, 2, *one_turn)]) == 0
    assert termgym_main(["train", *tiny_args(resumed, tiny_policy_dir, 1, *one_turn)]) == 0
    assert termgym_main(["train", *tiny_args(resumed, tiny_policy_dir, 2, *one_turn, "--resume")]) == 0
    a, b = (torch.load(d / "checkpoint.pt", weights_only=False) for d in (straight, resumed))
    for part in ("policy", "critic"):
        assert a[part].keys() == b[part].keys()
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part
    assert a["drawn"] == b["drawn"] and a["step"] == b["step"] == 2
    # the scheduler's run totals start again on resume; the rest is exact (the sampler's log-probs too)
    strip = lambda m: without_timings({k: v for k, v in m.items() if k != "scheduler"})  # noqa: E731
    assert [strip(m) for m in metrics_of(straight)] == [strip(m) for m in metrics_of(resumed)]


def checkpoint_digest(out: Path) -> dict[str, str]:
    """sha256 of each tensor of a run's checkpoint (policy, critic), by name."""
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    return {
        f"{part}.{name}": hashlib.sha256(tensor.numpy().tobytes()).hexdigest()
        for part in ("policy", "critic")
        for name, tensor in state[part].items()
    }


def test_two_runs_of_one_seed_give_the_same_metrics_and_checkpoint(tmp_path, tiny_policy_dir, no_leaks):
    # Over-sampling and cutting (3 launched for 2 kept, reweighted), two episodes in flight at once
    # sharing the sampler: on the wall clock and with batched forwards, which trials are kept and
    # the sampler's rounding would depend on timing. One command per episode: a random command's
    # output can depend on time (one that hits its timeout on a loaded machine). Two processes with
    # different string hashing: set and dict orders that depend on it show too.
    args = ("--max-turns", "1", "--mode", "reweight", "--launch", "3", "--seed", "5")
    first, second = tmp_path / "first", tmp_path / "second"
    for out, hashing in ((first, "1"), (second, "2")):
        command = [sys.executable, "-m", "termgym.trainer", *tiny_args(out, tiny_policy_dir, 2, *args)]
        env = {**os.environ, "PYTHONHASHSEED": hashing}
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
    a, b = metrics_of(first), metrics_of(second)
    assert [m["scheduler"]["kept"] for m in a] == [2, 2] and a[0]["generation_batch_mean"] == 1.0
    assert [without_timings(m) for m in a] == [without_timings(m) for m in b]
    assert checkpoint_digest(first) == checkpoint_digest(second)


def test_the_embedded_backends_rollouts_are_not_paced_and_a_providers_are():
    assert creation_pacer(Config(backend="local")).windows == ()
    assert creation_pacer(Config(backend="docker")).windows == default_windows()


def test_without_timings_drops_what_measures_time_at_any_depth():
    metrics = {
        "reward": 0.5,
        "rollout_seconds": 3.0,
        "update_tokens_per_second": 9.0,
        "scheduler": {"kept": 2, "wall_seconds": 1.0, "node_peaks": {"node-0": 2}, "families": [{"kept_seconds": 1}]},
    }
    assert without_timings(metrics) == {"reward": 0.5, "scheduler": {"kept": 2, "families": [{}]}}


def test_retokenize_mode_shows_drift(tmp_path, tiny_policy_dir, no_leaks):
    out = tmp_path / "retok"
    assert termgym_main(["train", *tiny_args(out, tiny_policy_dir, 1, "--retokenize")]) == 0
    assert metrics_of(out)[0]["token_drift"] > 0


def test_bad_flags_get_one_line(capsys):
    assert termgym_main(["train", "--steps", "many"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("termgym: error:") and len(err.strip().splitlines()) == 1


@pytest.mark.slow
@pytest.mark.parametrize("sharding", [(), ("--fsdp",)], ids=["replicated", "fsdp"])
def test_two_processes_match_one(tmp_path, tiny_policy_dir, no_leaks, sharding):
    single, double = tmp_path / "single", tmp_path / "double"
    assert termgym_main(["train", *tiny_args(single, tiny_policy_dir, 2, "--max-turns", "1")]) == 0
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        "termgym.trainer",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [*torchrun, *tiny_args(double, tiny_policy_dir, 2, "--max-turns", "1", *sharding)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    a, b = (torch.load(d / "checkpoint.pt", weights_only=False) for d in (single, double))
    for part in ("policy", "critic"):
        for key in a[part]:
            assert torch.allclose(a[part][key], b[part][key], atol=1e-5, rtol=1e-4), (part, key)


def bandit_upper_half(
    policy_dir, kl_coef: float = 0.0, advantage: Advantage = "gae", actor_lr: float = 1e-3
) -> tuple[float, float, list[dict]]:
    """20 PPO updates on a one-token bandit that rewards the upper half of the vocabulary; returns
    that half's probability before and after, and each update's metrics."""
    import copy

    from termgym.trainer.batch import make_batch
    from termgym.trainer.config import Config
    from termgym.trainer.models import Critic
    from termgym.trainer.ppo import ppo_update
    from termgym.trainer.trajectory import Sample, Trajectory

    torch.manual_seed(0)
    policy, tokenizer = load_policy(policy_dir)
    pad_id = tokenizer.pad_token_id
    assert isinstance(pad_id, int)
    reference = copy.deepcopy(policy).requires_grad_(False) if kl_coef else None
    critic = Critic(policy_dir)
    cfg = Config(
        actor_lr=actor_lr,
        critic_lr=1e-3,
        update_epochs=2,
        minibatch_size=8,
        routing_replay=False,
        kl_coef=kl_coef,
        advantage=advantage,
        group_size=4,
    )
    actor_opt = torch.optim.Adam(policy.parameters(), lr=cfg.actor_lr)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    prompt, half = [1, 2, 3], policy.config.vocab_size // 2
    generator = torch.Generator().manual_seed(0)

    def upper_half_probability() -> float:
        with torch.no_grad():
            return float(policy(input_ids=torch.tensor([prompt])).logits[0, -1].softmax(-1)[half:].sum())

    def one_update(step: int) -> dict:
        with torch.no_grad():
            logp = policy(input_ids=torch.tensor([prompt])).logits[0, -1].log_softmax(-1)
        tokens = torch.multinomial(logp.exp(), 32, replacement=True, generator=generator).tolist()
        batch = [
            Trajectory(
                task=f"bandit-{i // 4}",
                samples=[Sample(ids=[*prompt, t], loss_mask=[0, 0, 0, 1], logprobs=[0.0, 0.0, 0.0, float(logp[t])])],
                reward=float(t >= half),
            )
            for i, t in enumerate(tokens)
        ]
        return ppo_update(
            policy,
            critic,
            actor_opt,
            critic_opt,
            make_batch(batch, [1.0] * 32, pad_id),
            cfg,
            update_policy=True,
            step=step,
            reference=reference,
        )

    before = upper_half_probability()
    with one_thread():
        metrics = [one_update(step) for step in range(20)]
    return before, upper_half_probability(), metrics


def test_ppo_update_learns_a_one_token_bandit(tiny_policy_dir):
    """The update itself, on sampled trajectories of one token: rewarding the upper half of the
    vocabulary must raise its probability from a half to nearly 1 in 20 updates (0.496 to 0.992
    measured with the actor at 3e-3; a trainer that barely learns, or a sign or masking error in
    the losses, would not). tests/trainer/test_learning.py holds the harder environments."""
    before, after, metrics = bandit_upper_half(tiny_policy_dir, actor_lr=3e-3)
    assert 0.4 < before < 0.6 and after > 0.95, (before, after)
    assert all(m["kl_to_reference"] is None for m in metrics)  # no anchor: no reference model
    assert all(m["approx_kl"] is not None and m["approx_kl"] >= 0.0 for m in metrics)


def test_the_group_advantage_learns_the_bandit_without_touching_the_critic(tiny_policy_dir):
    """Groups of 4 episodes of the same task: the leave-one-out advantage alone must raise the
    rewarded half's probability, and the critic is neither read (no explained variance) nor trained."""
    before, after, metrics = bandit_upper_half(tiny_policy_dir, advantage="group", actor_lr=3e-3)
    assert 0.4 < before < 0.6 and after > 0.95, (before, after)  # 0.992 measured
    assert all(m["explained_variance"] is None and m["value_loss"] is None for m in metrics)


def test_grouped_draws_launch_each_task_group_size_times_and_resume_where_they_stopped():
    from types import SimpleNamespace

    from termgym.trainer.ppo import CountingPool

    tasks = [SimpleNamespace(name=f"t{i}") for i in range(10)]  # the pool only orders them

    def pool() -> CountingPool:
        return CountingPool(tasks, seed=3, group_size=4)

    first = pool()
    drawn = first.draw(10)  # three tasks: 4 + 4 + 2 launches
    assert [t.name for t in drawn[:4]] == [drawn[0].name] * 4 and drawn[4].name != drawn[0].name
    assert len(drawn) == 10 and len({t.name for t in drawn}) == 3 and first.drawn == 3
    resumed = pool()
    resumed.replay(first.drawn)
    assert [t.name for t in resumed.draw(8)] == [t.name for t in first.draw(8)]


def test_the_kl_anchor_holds_the_policy_near_its_start(tiny_policy_dir):
    """The same bandit with the KL penalty: the measured KL starts at exactly 0 (the reference is
    the starting policy) and the policy moves less than without the anchor, but still learns."""
    before, free, _ = bandit_upper_half(tiny_policy_dir)
    _, anchored, metrics = bandit_upper_half(tiny_policy_dir, kl_coef=1.0)
    assert metrics[0]["kl_to_reference"] == 0.0 and metrics[-1]["kl_to_reference"] > 0.0
    assert before < anchored < free - 0.05, (before, anchored, free)


def test_ppo_update_reports_cleanrls_diagnostics(tiny_policy_dir):
    """approx_kl (CleanRL's, over action tokens, averaged over the policy minibatches; None when
    only the critic trains), clip_fraction, explained_variance and entropy, and the batch's reward
    signal: the share of task groups of 2 or more episodes with equal rewards, and the rewards'
    population std."""
    from termgym.trainer.batch import make_batch
    from termgym.trainer.config import Config
    from termgym.trainer.models import Critic
    from termgym.trainer.ppo import ppo_update
    from termgym.trainer.trajectory import Sample, Trajectory

    torch.manual_seed(0)
    policy, tokenizer = load_policy(tiny_policy_dir)
    critic = Critic(tiny_policy_dir)
    cfg = Config(actor_lr=1e-3, critic_lr=1e-3, minibatch_size=2, routing_replay=False)
    actor_opt = torch.optim.Adam(policy.parameters(), lr=cfg.actor_lr)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    # tasks a (passed twice: equal), b (0 and 1: not equal), c (alone: never equal)
    rewards = {"a": [1.0, 1.0], "b": [0.0, 1.0], "c": [0.0]}
    trajectories = [
        Trajectory(task=task, samples=[Sample(ids=[1, 2, 3, 40 + i], loss_mask=[0, 0, 0, 1], logprobs=[0.0] * 4)])
        for task, rs in rewards.items()
        for i, _ in enumerate(rs)
    ]
    for t, r in zip(trajectories, [r for rs in rewards.values() for r in rs]):
        t.reward = r
    pad_id = tokenizer.pad_token_id
    assert isinstance(pad_id, int)
    batch = make_batch(trajectories, [1.0] * len(trajectories), pad_id)

    def update(update_policy: bool, step: int) -> dict:
        return ppo_update(policy, critic, actor_opt, critic_opt, batch, cfg, update_policy=update_policy, step=step)

    with one_thread():
        warmup, trained = update(False, 0), update(True, 1)
    for m in (warmup, trained):
        assert m["equal_reward_share"] == pytest.approx(1 / 3)  # a of a, b, c
        assert m["reward_std"] == pytest.approx(float(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.0]).std(correction=0)))
        assert m["entropy"] > 0 and m["explained_variance"] is not None
    assert warmup["approx_kl"] is None and warmup["clip_fraction"] is None
    # 5 episodes in minibatches of 2, 2 epochs: 6 minibatches; the first one's is exactly 0 (nothing
    # moved yet), the later ones' positive
    assert trained["approx_kl"] is not None and trained["approx_kl"] > 0.0
    assert 0.0 <= trained["clip_fraction"] <= 1.0


def test_the_progress_line_shows_approx_kl_as_kl_and_the_anchor_as_ref_kl():
    from termgym.trainer.metrics import progress_line

    m = {
        "step": 4,
        "reward": 0.25,
        "resolved": 0.0,
        "passed": 1.0,
        "turns": 2.0,
        "tokens": 300,
        "explained_variance": 0.5,
        "clip_fraction": 0.12,
        "approx_kl": 0.0034,
        "entropy": 1.5,
        "logprob_gap": 1e-5,
        "token_drift": 0,
        "bridge_break_rate": 0.0,
        "segments_per_episode": 1.0,
        "kl_to_reference": 0.0123,
        "staleness_max": 0,
        "rollout_seconds": 1.0,
        "update_seconds": 2.0,
    }
    line = progress_line(m, 10)
    assert "clip 0.12 kl 3.4e-03 entropy 1.50" in line and "ref_kl 0.0123" in line
    warmup = progress_line({**m, "approx_kl": None, "clip_fraction": None, "kl_to_reference": None}, 10)
    assert "clip 0.00 entropy" in warmup and "kl" not in warmup


@pytest.fixture(scope="module")
def wide_window_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama-style chat model as a new user brings one: a context window of 4096 in its
    config, and a tokenizer that is not the project's (nearly byte-level: 300 ids learnt from one
    line of text), so that the tool-format prompt alone is longer than 1024 tokens."""
    from termgym.trainer.architectures import build_architecture_policy
    from termgym.trainer.tokenizer import train_family_tokenizer

    tokenizer = train_family_tokenizer(["the quick brown fox jumps over the lazy dog"], "llama3", vocab_size=300)
    return build_architecture_policy(tmp_path_factory.mktemp("llama"), "llama", tokenizer, seed=0, context=4096)


def one_step_args(out: Path, model: Path, *extra: str) -> list[str]:
    return [
        "train",
        *("--model", str(model), "--out", str(out), "--tasks", TASKS[0], "--steps", "1"),
        *("--batch-size", "1", "--minibatch-size", "1", "--concurrency", "1", "--max-turns", "1"),
        *("--max-new-tokens", "8", "--action-format", "tool", *extra),
    ]


def test_a_model_trains_within_its_own_context_window_by_default(tmp_path, wide_window_llama, no_leaks, capsys):
    """Defect 6 of issue 31: without --max-context, --model DIR kept the tiny policy's 1024 tokens,
    every episode ended at context_exhausted before its first reply, and the run stopped with "no
    trajectory sampled anything". Now the model's own window (4096) applies."""
    out = tmp_path / "run"
    assert termgym_main(one_step_args(out, wide_window_llama)) == 0
    assert "--max-context 4096: the context window of" in capsys.readouterr().err
    (step,) = metrics_of(out)
    assert step["context_exhausted"] == 0.0 and step["action_tokens"] > 0
    (trajectory,) = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert 1024 < trajectory["prompt_tokens"] < 4096  # the prompt that did not fit in the old default
    assert (out / "checkpoint.pt").exists()  # the step finished and was saved


def test_a_context_too_short_for_the_prompt_is_said_with_both_lengths(tmp_path, wide_window_llama, no_leaks, capsys):
    assert termgym_main(one_step_args(tmp_path / "run", wide_window_llama, "--max-context", "1024")) != 0
    err = capsys.readouterr().err.strip()
    last = err.splitlines()[-1]  # after the progress bars: the one line, no traceback
    assert (
        last.startswith("termgym: training_error: every episode (1) ended before its first reply")
        and "Traceback" not in err
    )
    prompt = int(last.split("the prompt is ")[1].split(" tokens")[0])
    assert 1024 < prompt < 4096 and "and --max-context 1024 leaves no room for a reply" in last
