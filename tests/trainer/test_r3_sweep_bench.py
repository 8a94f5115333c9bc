"""``bench/r3_sweep.py`` and the measurement it shares with ``bench/r3_gap.py``: a float32 sampler
flips nothing and has no gap, a sampler that routes elsewhere flips often and replay removes most
of its gap, the table and summary on known figures, and the quick run end to end."""

from __future__ import annotations

import asyncio
import copy
import subprocess
import sys

import pytest
import torch

from termgym.trainer.routing import moe_routers
from tests.helpers import REPO_ROOT, load_bench

sweep = load_bench("r3_sweep")


def measured(top1: float, gap_off: float, gap_on: float):
    return sweep.Measured(
        tokens=100, entropy=1.0, top1=top1, top1_layer=top1 / 2, set_differs=top1, gap_off=gap_off, gap_on=gap_on
    )


def test_the_table_has_every_configuration_and_the_summary_names_the_frequent_ones():
    often, rare = sweep.Config(32, "bfloat16", 0), sweep.Config(4, "float16", 40)
    results = {
        often: [measured(0.06, 2e-3, 1e-3), measured(0.08, 4e-3, 3e-3)],  # reductions 50% and 25%
        rare: [measured(0.01, 1e-3, 1e-3), measured(0.02, 1e-3, 1e-3)],
    }
    lines = sweep.table(results).splitlines()
    assert len(lines) == 2 + len(results) + 1  # header, rule, one row each, the published row
    assert lines[2].startswith("| 32 | bfloat16 | random | ") and "| 0.070 ± 0.014 |" in lines[2]
    assert lines[2].endswith("| 38% ± 18% |")
    assert lines[3].startswith("| 4 | float16 | sft 40 steps | ") and lines[3].endswith("| 0% ± 0% |")
    assert "38%" in lines[-1] and "2.10e-02" in lines[-1]
    assert sweep.frequent(results) == [often]
    text = sweep.summary(results)
    assert "in 1 of 2 configurations" in text and "reduction there 38% ± 18%" in text
    nowhere = sweep.summary({rare: results[rare]})
    assert nowhere.startswith("No configuration flips the top-1 expert on 5% of tokens")
    assert (
        "largest reduction: 4 experts, float16, sft 40 steps (top-1 flips 0.015 ± 0.007, reduction 0% ± 0%)" in nowhere
    )


@pytest.fixture(scope="module")
def small_policy(tmp_path_factory):
    policy_dir = sweep.build_tiny_policy(tmp_path_factory.mktemp("policy"), seed=0, experts=8, head_dim=64)
    return sweep.load_policy(policy_dir)


def test_a_float32_sampler_flips_nothing_and_a_bfloat16_one_has_a_gap():
    results = sweep.sweep(
        experts=[4], precisions=["float32", "bfloat16"], sft_steps=[0, 20], seeds=[0], episodes=2, hidden=64, layers=2
    )
    assert [c.name for c in results] == [
        "4 experts, float32, random",
        "4 experts, bfloat16, random",
        "4 experts, float32, sft 20 steps",
        "4 experts, bfloat16, sft 20 steps",
    ]
    for config, [run] in results.items():
        assert run.tokens > 0
        if config.precision == "float32":  # the same forward but for the key/value cache
            assert run.top1 == run.top1_layer == run.set_differs == 0.0
            assert run.gap_off < 1e-5 and run.gap_on < 1e-5
        else:
            assert run.gap_off > 1e-4  # bfloat16 rounding is visible in the log-probs
    random_run, sharp_run = results[sweep.Config(4, "float32", 0)][0], results[sweep.Config(4, "float32", 20)][0]
    assert random_run.entropy > 6.5  # near log(1024): a uniform next token
    assert sharp_run.entropy < random_run.entropy - 1  # the supervised steps sharpen it


def test_a_sampler_routing_elsewhere_flips_often_and_replay_removes_most_of_its_gap(small_policy):
    """The sampler is the float32 policy with its routers moved (nothing else differs), so every
    flip is a routing difference and replaying the sampler's experts must close most of the gap."""
    policy, tokenizer = small_policy
    moved = copy.deepcopy(policy)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for router in moe_routers(moved):
            weight = router.weight
            assert isinstance(weight, torch.Tensor)
            weight.add_(0.3 * weight.std() * torch.randn(weight.shape, generator=generator))
    sampler = sweep.BatchedSampler(moved, pad_id=tokenizer.pad_token_id)
    row = sweep.measure(policy, tokenizer, asyncio.run(sweep.roll_out(sampler, tokenizer, 2)))
    assert row["top1"] > 0.2 and row["set_differs"] >= row["top1_layer"] > 0.05
    assert row["gap_on"] < 0.6 * row["gap_off"]


@pytest.mark.slow
def test_the_quick_run_prints_every_configuration():
    done = subprocess.run(
        [sys.executable, "bench/r3_sweep.py", "--quick"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and "bfloat16" in line]
    assert [r.split(" | ")[:3] for r in rows] == [
        ["| 4", "bfloat16", "random"],
        ["| 4", "bfloat16", "sft 40 steps"],
        ["| 32", "bfloat16", "random"],
        ["| 32", "bfloat16", "sft 40 steps"],
    ]
    assert "published 0.021 -> 0.013, a 38% reduction" in done.stdout


def test_the_fp8_sampler_rounds_attention_and_expert_weights_only(small_policy):
    policy, _ = small_policy
    sampler = sweep.sampler_copy(policy, "fp8")
    trainer_weights, sampler_weights = dict(policy.named_parameters()), dict(sampler.named_parameters())
    assert all(w.dtype == torch.bfloat16 for w in sampler_weights.values())
    for name, weight in trainer_weights.items():
        rounded = sampler_weights[name].float()
        if (".self_attn." in name and weight.dim() == 2) or ".mlp.experts." in name:
            scale = weight.abs().amax() / sweep.FP8_MAX
            units = rounded / scale  # FP8 values, then one bfloat16 rounding (8 bits, FP8 steps are 3)
            assert torch.allclose(units.to(torch.float8_e4m3fn).float(), units, rtol=2**-7, atol=0)
            assert not torch.equal(rounded, weight)
            # three mantissa bits: within 1/16 of each weight, or of the smallest normal step
            assert ((rounded - weight).abs() <= weight.abs() / 16 + scale * 2**-6).all()
        else:  # the router, norms, embeddings and head: bfloat16 only
            assert torch.equal(rounded, weight.to(torch.bfloat16).float()), name
