"""PPO update throughput against the arithmetic floor, on CPU (or CUDA when present).

The floor is one plain forward-and-backward pass of the policy and of the critic over the same
minibatches (no optimizer, no GAE, no recomputed log-probs). The PPO update (termgym.trainer.ppo.ppo_update,
one epoch) adds the no-grad forward passes for old log-probs and values, masked GAE, whitening, the
clipped losses, gradient clipping and two Adam steps. Prints tokens per second of both and their
ratio (PPO / floor; the target is at least 0.5).

    .venv/bin/python bench/ppo_throughput.py [--batch 16] [--length 512] [--repeats 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from termgym.trainer.batch import Batch, forward_logp, forward_values, make_batch
from termgym.trainer.config import Config
from termgym.trainer.models import Critic, build_tiny_policy, load_policy
from termgym.trainer.ppo import ppo_update
from termgym.trainer.trajectory import Sample, Trajectory


def synthetic_batch(batch: int, length: int, vocab: int, pad_id: int) -> Batch:
    """Episodes of ``length`` tokens: a 64-token prompt, then alternating 32 sampled and 32
    observation tokens; a reward in [0, 1] on the last sampled token."""
    g = torch.Generator().manual_seed(0)
    trajectories = []
    for _ in range(batch):
        ids = torch.randint(4, vocab, (length,), generator=g).tolist()
        mask = [0] * 64 + [(i // 32) % 2 == 0 for i in range(length - 64)]
        mask = [int(m) for m in mask]
        logprobs = [-7.0 * m for m in mask]
        reward = float(torch.rand((), generator=g))
        sample = Sample(ids=ids, loss_mask=mask, logprobs=logprobs)
        trajectories.append(Trajectory(task="bench", samples=[sample], reward=reward))
    return make_batch(trajectories, [1.0] * batch, pad_id)


def floor_pass(policy, critic, batch: Batch, minibatch: int) -> None:
    for start in range(0, len(batch["ids"]), minibatch):
        ids, attention = batch["ids"][start : start + minibatch], batch["attention"][start : start + minibatch]
        logp, _ = forward_logp(policy, ids, attention)
        logp.mean().backward()
        forward_values(critic, ids, attention).mean().backward()
    policy.zero_grad()
    critic.zero_grad()


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--minibatch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hidden", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_policy(tmp, hidden=args.hidden, layers=4, experts=8)
        policy, tokenizer = load_policy(tmp)
        critic = Critic(tmp)
    params = sum(p.numel() for p in policy.parameters())
    pad_id = tokenizer.pad_token_id
    assert isinstance(pad_id, int)  # the tiny policy's tokenizer has its pad token
    batch = synthetic_batch(args.batch, args.length, len(tokenizer), pad_id)
    cfg = Config(update_epochs=1, minibatch_size=args.minibatch, actor_lr=1e-6, critic_lr=1e-6)
    actor_opt = torch.optim.Adam(policy.parameters(), lr=cfg.actor_lr)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    tokens = int(batch["attention"].sum())
    floor = timed(lambda: floor_pass(policy, critic, batch, args.minibatch), args.repeats)
    update = timed(
        lambda: ppo_update(policy, critic, actor_opt, critic_opt, batch, cfg, update_policy=True, step=0), args.repeats
    )
    print(
        f"model: Qwen3-MoE, {params:,} parameters (policy; the critic is the same size); "
        f"batch {args.batch} x {args.length} tokens, minibatch {args.minibatch}, {torch.get_num_threads()} threads"
    )
    print(f"floor (forward+backward, policy and critic): {tokens / floor:10.0f} tokens/s")
    print(f"PPO update (one epoch):                      {tokens / update:10.0f} tokens/s")
    print(f"ratio PPO / floor: {floor / update:.2f} (target >= 0.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
