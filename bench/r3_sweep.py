"""Where routing replay (R3) matters: the top-1 expert flip rate and the train/inference log-prob
gap with R3 off and on, swept over experts per layer, sampler precision and policy sharpness, in
one run, one table.

Each configuration is ``bench/r3_gap.py``'s measurement (its scripted three-turn episodes, sampled
at temperature 1 by the torch ``BatchedSampler`` recording its routing, against the float32
trainer; its ``measure``) on one tiny Qwen3-MoE policy: top-2 routing, the tiny preset's hidden
128 and 3 layers (``--hidden 64 --layers 2``: the size ``r3_gap.py`` measures), head_dim 64:

- experts per layer (``--experts``, default 4 8 16 32 64);
- sampler precision: the trainer's weights cast to bfloat16 or float16, or ``fp8``: attention and
  expert weights rounded through FP8 E4M3 (one scale per tensor, as vLLM's ``--quantization fp8``)
  and computed in bfloat16 (``--precisions``; float32 is the control: the same forward except the
  key/value cache, so nothing should flip);
- policy sharpness (``--sft-steps``): the randomly initialised policy (0 steps: near-uniform
  next-token distributions), and that policy after N supervised steps (``trainer/sft.py``'s
  ``supervised_train``, the warm start's AdamW at its learning rate, each N from the random
  start) on one fixed demonstration of the same scripted episode (``ls /app``,
  ``wc -w /app/notes.txt``, submit): the more steps, the more confident its sampled tokens.
  Sampling stays at temperature 1; the table gives each condition's measured entropy.

Per configuration, over the sampled tokens (the loss region), mean and sd over ``--seeds`` (the
policy's initialisation):

- entropy: the trainer's mean next-token entropy (nats) where a token was sampled;
- top-1 flips: sampled tokens whose top-1 expert differs between sampler and trainer in at least
  one MoE layer; per layer: the same per (token, layer); set differs: tokens whose top-2 *set*
  differs in some layer (a swapped top-1 and top-2 routes to the same experts, so only these can
  replay change);
- gap R3 off / on: mean |logp_train - logp_sampler|, the trainer routing freely or replaying the
  sampler's experts; reduction: 1 - on/off, per seed, then averaged.

The summary names the configurations whose mean top-1 flip rate is at least 5% (``FREQUENT``) and
R3's reduction there, next to the published 0.021 -> 0.013 (Qwen3.5-122B-A10B, a 38% reduction;
quoted, not run). No target: it is a measurement.

    .venv/bin/python bench/r3_sweep.py [--seeds 0 1 2 3 4] [--episodes 12] [--experts 4 8 16 32 64]
        [--precisions bfloat16 float16 fp8] [--sft-steps 0 20 40] [--hidden 128] [--layers 3] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from r3_gap import INSTRUCTION, ScriptedEnv, measure, roll_out

from termgym.agents.model import LoopSettings, ModelAgent
from termgym.agents.renderers import make_renderer
from termgym.trainer.models import build_tiny_policy, load_policy
from termgym.trainer.policy_client import TeacherClient
from termgym.trainer.rollout import SHORT_TEXT_SYSTEM, RolloutSettings
from termgym.trainer.sampler import BatchedSampler
from termgym.trainer.sft import reference_replies, supervised_train

PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "fp8": torch.bfloat16}
FP8_MAX = 448.0  # the largest finite float8_e4m3fn
DEMONSTRATION = ("ls /app", "wc -w /app/notes.txt")  # then the submit
FREQUENT = 0.05  # top-1 flip rate from which a configuration counts as flipping often
PUBLISHED_OFF, PUBLISHED_ON = 0.021, 0.013  # Qwen3.5-122B-A10B, R3 off and on
QUICK = {"experts": [4, 32], "precisions": ["bfloat16"], "sft_steps": [0, 40], "seeds": [0], "episodes": 4}


@dataclass(frozen=True)
class Config:
    experts: int
    precision: str
    sft_steps: int  # 0: the randomly initialised policy

    @property
    def policy(self) -> str:
        return f"sft {self.sft_steps} steps" if self.sft_steps else "random"

    @property
    def name(self) -> str:
        return f"{self.experts} experts, {self.precision}, {self.policy}"


@dataclass(frozen=True)
class Measured:
    """One configuration at one seed: ``r3_gap.measure``'s figures."""

    tokens: int
    entropy: float
    top1: float
    top1_layer: float
    set_differs: float
    gap_off: float
    gap_on: float

    @property
    def reduction(self) -> float | None:
        return 1 - self.gap_on / self.gap_off if self.gap_off > 0 else None


def demonstration_rows(tokenizer) -> list[tuple[list[int], list[int]]]:
    """The fixed text the sharpened policies learn: one reference episode of ``r3_gap``'s scripted
    environment (``DEMONSTRATION``, then the submit), as the warm start's (ids, mask) rows."""
    renderer = make_renderer("chatml", tokenizer)
    loop = LoopSettings(action_format="text", max_tokens=24, context="none", system_prompt=SHORT_TEXT_SYSTEM)
    settings = RolloutSettings(loop, max_context=512, observation_tokens=32)
    replies = reference_replies(renderer, settings, DEMONSTRATION)
    client = TeacherClient(renderer, replies, settings.max_context, settings.observation_tokens)
    env = ScriptedEnv()
    asyncio.run(ModelAgent(client, loop, name="reference").run(env, INSTRUCTION, {}))  # pyright: ignore[reportArgumentType]  # the scripted env is what the agent uses of one
    segment = env.transcript.segments[0]
    return [(list(segment.ids), list(segment.mask))]


def sharpened(policy, rows, *, steps: int, seed: int, pad_id: int):
    """A copy of ``policy`` after ``steps`` supervised steps on ``rows`` (float32, eval mode)."""
    trained = copy.deepcopy(policy)
    supervised_train(trained, rows, steps=steps, batch_size=len(rows), lr=3e-3, seed=seed, pad_id=pad_id)
    return trained.eval()


def fp8_weights(policy) -> None:
    """Round ``policy``'s attention and expert weights, in place, through FP8 E4M3 with one scale
    per tensor (its largest magnitude at ``FP8_MAX``), as a weight-only FP8 sampler does (vLLM's
    ``--quantization fp8``); the router, norms, embeddings and head stay as they are."""
    with torch.no_grad():
        for name, weight in policy.named_parameters():
            if weight.dim() >= 2 and (".self_attn." in name or ".mlp.experts." in name):
                scale = weight.abs().amax().clamp(min=1e-12) / FP8_MAX
                weight.copy_((weight / scale).to(torch.float8_e4m3fn).to(weight.dtype) * scale)


def sampler_copy(policy, precision: str):
    """The sampler's copy of the float32 trainer ``policy`` in ``precision`` (``fp8``: FP8-rounded
    weights, computed in bfloat16)."""
    sampler_policy = copy.deepcopy(policy)
    if precision == "fp8":
        fp8_weights(sampler_policy)
    return sampler_policy.to(PRECISIONS[precision])


def measure_config(policy, tokenizer, precision: str, episodes: int) -> Measured:
    """``r3_gap``'s measurement of ``policy`` (the float32 trainer) against its copy in ``precision``."""
    pad_id = tokenizer.pad_token_id
    sampler_policy = sampler_copy(policy, precision)
    sampler = BatchedSampler(sampler_policy, pad_id=pad_id)
    row = measure(policy, tokenizer, asyncio.run(roll_out(sampler, tokenizer, episodes)))
    return Measured(
        tokens=row["tokens"],
        entropy=row["entropy"],
        top1=row["top1"],
        top1_layer=row["top1_layer"],
        set_differs=row["set_differs"],
        gap_off=row["gap_off"],
        gap_on=row["gap_on"],
    )


def sweep(
    *,
    experts: Sequence[int],
    precisions: Sequence[str],
    sft_steps: Sequence[int],
    seeds: Sequence[int],
    episodes: int,
    hidden: int = 128,
    layers: int = 3,
    progress: Callable[[str], None] | None = None,
) -> dict[Config, list[Measured]]:
    """Every configuration at every seed: one random policy per (experts, seed), each sharpened
    policy trained from it, each measured against every sampler precision."""
    results: dict[Config, list[Measured]] = {
        Config(e, p, n): [] for e in experts for n in sft_steps for p in precisions
    }
    with tempfile.TemporaryDirectory() as tmp:
        rows = None
        for n_experts in experts:
            for seed in seeds:
                policy_dir = build_tiny_policy(
                    Path(tmp) / f"e{n_experts}-s{seed}",
                    seed=seed,
                    hidden=hidden,
                    layers=layers,
                    experts=n_experts,
                    head_dim=64,
                )
                random_policy, tokenizer = load_policy(policy_dir)
                pad_id = tokenizer.pad_token_id
                assert isinstance(pad_id, int)  # the tiny policy's tokenizer has its pad token
                for steps in sft_steps:
                    policy = random_policy
                    if steps:
                        rows = rows or demonstration_rows(tokenizer)
                        policy = sharpened(random_policy, rows, steps=steps, seed=seed, pad_id=pad_id)
                    for precision in precisions:
                        config = Config(n_experts, precision, steps)
                        results[config].append(measure_config(policy, tokenizer, precision, episodes))
                        if progress is not None:
                            progress(f"{config.name}, seed {seed}")
    return results


def mean_sd(values: Sequence[float], fmt: str) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return format(values[0], fmt)
    return f"{format(statistics.mean(values), fmt)} ± {format(statistics.stdev(values), fmt)}"


def reductions(runs: Sequence[Measured]) -> list[float]:
    return [r for run in runs if (r := run.reduction) is not None]


def table(results: dict[Config, list[Measured]]) -> str:
    """The markdown table: one row per configuration, mean ± sd over seeds."""
    lines = [
        "| experts | sampler | policy | entropy (nats) | tokens | top-1 flips | per layer | set differs "
        "| gap R3 off | gap R3 on | reduction |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for config, runs in results.items():
        lines.append(
            f"| {config.experts} | {config.precision} | {config.policy} "
            f"| {mean_sd([r.entropy for r in runs], '.2f')} | {sum(r.tokens for r in runs)} "
            f"| {mean_sd([r.top1 for r in runs], '.3f')} | {mean_sd([r.top1_layer for r in runs], '.3f')} "
            f"| {mean_sd([r.set_differs for r in runs], '.3f')} "
            f"| {mean_sd([r.gap_off for r in runs], '.2e')} | {mean_sd([r.gap_on for r in runs], '.2e')} "
            f"| {mean_sd(reductions(runs), '.0%')} |"
        )
    published = 1 - PUBLISHED_ON / PUBLISHED_OFF
    lines.append(
        f"| published (Qwen3.5-122B-A10B) | | | | | | | | {PUBLISHED_OFF:.2e} | {PUBLISHED_ON:.2e} | {published:.0%} |"
    )
    return "\n".join(lines)


def mean_of(runs: Sequence[Measured], figure: Callable[[Measured], float | None]) -> float:
    """The mean of ``figure`` over ``runs`` (0.0 when none has it)."""
    values = [v for r in runs if (v := figure(r)) is not None]
    return statistics.mean(values) if values else 0.0


def frequent(results: dict[Config, list[Measured]]) -> list[Config]:
    """The configurations whose mean top-1 flip rate is at least ``FREQUENT``."""
    return [c for c, runs in results.items() if runs and mean_of(runs, lambda r: r.top1) >= FREQUENT]


def described(config: Config, runs: Sequence[Measured]) -> str:
    flips, cut = mean_sd([r.top1 for r in runs], ".3f"), mean_sd(reductions(runs), ".0%")
    return f"{config.name} (top-1 flips {flips}, reduction {cut})"


def summary(results: dict[Config, list[Measured]]) -> str:
    """One paragraph: where the top-1 expert flips on at least ``FREQUENT`` of the tokens and R3's
    reduction there (or, when nowhere, the configurations that flip most and that R3 helps most),
    next to the published figures."""
    published = 1 - PUBLISHED_ON / PUBLISHED_OFF
    quoted = f"published {PUBLISHED_OFF} -> {PUBLISHED_ON}, a {published:.0%} reduction"
    often = frequent(results)
    if not often:
        most = max(results, key=lambda c: mean_of(results[c], lambda r: r.top1))
        helped = max(results, key=lambda c: mean_of(results[c], lambda r: r.reduction))
        return (
            f"No configuration flips the top-1 expert on {FREQUENT:.0%} of tokens. Most flips: "
            f"{described(most, results[most])}; largest reduction: {described(helped, results[helped])}; "
            f"against the {quoted}."
        )
    pooled = [x for c in often for x in reductions(results[c])]
    return (
        f"Top-1 flips on >= {FREQUENT:.0%} of tokens in {len(often)} of {len(results)} configurations; "
        f"R3's reduction there {mean_sd(pooled, '.0%')} (all their seeds) against the {quoted}: "
        + "; ".join(described(c, results[c]) for c in often)
        + "."
    )


def main() -> int:
    assert __doc__ is not None  # the module docstring: the description
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4], help="policy initialisations")
    parser.add_argument("--episodes", type=int, default=12, help="scripted episodes per configuration and seed")
    parser.add_argument(
        "--experts", type=int, nargs="+", default=[4, 8, 16, 32, 64], help="experts per MoE layer (top-2)"
    )
    parser.add_argument(
        "--precisions",
        nargs="+",
        choices=list(PRECISIONS),
        default=["bfloat16", "float16", "fp8"],
        help="sampler precisions (the trainer: float32; fp8: FP8-rounded weights computed in bfloat16)",
    )
    parser.add_argument(
        "--sft-steps", type=int, nargs="+", default=[0, 20, 40], help="policy sharpness: supervised steps (0: random)"
    )
    parser.add_argument("--hidden", type=int, default=128, help="hidden size (the tiny preset's)")
    parser.add_argument("--layers", type=int, default=3, help="decoder layers (the tiny preset's)")
    parser.add_argument(
        "--quick", action="store_true", help=f"a short run: {', '.join(f'{k} {v}' for k, v in QUICK.items())}"
    )
    args = parser.parse_args()
    if args.quick:
        vars(args).update(QUICK)
    for name in ("experts", "seeds", "sft_steps"):
        if len(set(getattr(args, name))) != len(getattr(args, name)):
            parser.error(f"--{name.replace('_', '-')} repeats a value")
    started = time.monotonic()
    results = sweep(
        experts=args.experts,
        precisions=args.precisions,
        sft_steps=args.sft_steps,
        seeds=args.seeds,
        episodes=args.episodes,
        hidden=args.hidden,
        layers=args.layers,
        progress=lambda what: print(f"[{time.monotonic() - started:6.1f} s] {what}", file=sys.stderr, flush=True),
    )
    print(table(results))
    print()
    print(summary(results))
    print(
        f"\n{time.monotonic() - started:.0f} s; seeds {' '.join(map(str, args.seeds))}, {args.episodes} episodes each"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
