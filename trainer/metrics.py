"""A step's metrics: what ``metrics.jsonl`` holds for each PPO step (``summarise``: the episodes,
the update, the scheduler; ``sampler_metrics``: what the sampler did), what of it measures time,
and the line ``termgym train`` prints for it."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from termgym.scheduling.scheduler import KeptTrial, step_metrics

from . import losses
from .config import Config, warmup_steps
from .sampler import Sampler
from .trajectory import Trajectory, token_drift


def episode_metrics(trajectories: Sequence[Trajectory]) -> dict:
    """Pure: what the episode loop counted over a step's trajectories. ``bridge_break_rate``: the
    share of turn boundaries whose prefix could not be kept; ``segments_per_episode``: training
    samples per episode; ``parse_error_rate``: replies that did not parse, per reply;
    ``context_exhausted``: the share of episodes that ended for want of context; compaction
    attempts and failures (summaries asked for, and those that failed)."""
    n = max(len(trajectories), 1)
    boundaries = sum(t.bridges + t.bridge_breaks for t in trajectories)
    replies = sum(t.replies for t in trajectories)
    return {
        "bridge_break_rate": sum(t.bridge_breaks for t in trajectories) / boundaries if boundaries else 0.0,
        "segments_per_episode": sum(len(t.samples) for t in trajectories) / n,
        "parse_error_rate": sum(t.parse_errors for t in trajectories) / replies if replies else 0.0,
        "context_exhausted": sum(t.context_exhausted for t in trajectories) / n,
        "compactions": sum(t.summaries + t.summaries_failed for t in trajectories),
        "compaction_failures": sum(t.summaries_failed for t in trajectories),
    }


def summarise(step: int, kept: Sequence[KeptTrial[Trajectory]], update: dict, result, timings: dict) -> dict:
    trajectories = [k.result for k in kept]
    records = [k.record for k in kept]
    n = max(len(kept), 1)
    samples = [s for t in trajectories for s in t.samples]
    action_tokens = sum(sum(s.loss_mask) for s in samples)
    return {
        "step": step,
        "reward": sum(t.reward for t in trajectories) / n,
        "resolved": sum(r.resolved for r in records) / n,
        "passed": sum(r.passed for r in records) / n,
        "turns": sum(r.turns for r in records) / n,
        # families whose episodes all got the same reward: no two outcomes of that kind of task to learn from
        "equal_reward_families": losses.equal_reward_share(
            torch.tensor([t.reward for t in trajectories], dtype=torch.float64), [r.family for r in records]
        ),
        "tokens": sum(len(s.ids) for s in samples),
        "action_tokens": action_tokens,
        "token_drift": sum(token_drift(t) for t in trajectories),
        "policy_versions": sorted({t.policy_version for t in trajectories}),
        **episode_metrics(trajectories),
        "staleness_max": max((k.staleness for k in kept), default=0),
        "staleness_mean": sum(k.staleness for k in kept) / n,
        **update,
        **timings,
        "update_tokens_per_second": action_tokens / timings["update_seconds"] if timings["update_seconds"] else None,
        "scheduler": step_metrics(result),
    }


# Metrics that measure time (and the scheduler's peaks of trials in flight at once, which timing decides):
# everything else in metrics.jsonl is the same for two runs of one seed on one machine (--deterministic).
TIMING_METRICS = ("node_peaks", "lower_bound", "update_tokens_per_second")


def without_timings(metrics: object) -> object:
    """Pure: ``metrics`` (a step's, nested) without what measures time: every key with ``seconds``
    in its name and ``TIMING_METRICS``; what two deterministic runs of one seed must agree on."""
    if isinstance(metrics, dict):
        return {k: without_timings(v) for k, v in metrics.items() if "seconds" not in k and k not in TIMING_METRICS}
    if isinstance(metrics, list):
        return [without_timings(v) for v in metrics]
    return metrics


def progress_line(m: dict, steps: int) -> str:
    ev = m["explained_variance"]
    return (
        f"step {m['step'] + 1}/{steps} reward {m['reward']:.3f} resolved {m['resolved']:.2f} passed {m['passed']:.1f} "
        f"turns {m['turns']:.1f} tokens {m['tokens']} "
        + (f"ev {ev:.2f} " if ev is not None else "")
        + f"clip {m['clip_fraction'] or 0:.2f} "
        + (f"kl {m['approx_kl']:.1e} " if m.get("approx_kl") is not None else "")  # none during the warm-up
        + f"entropy {m['entropy']:.2f} gap {m['logprob_gap']:.2e} drift {m['token_drift']} "
        f"breaks {m['bridge_break_rate']:.2f} segs {m['segments_per_episode']:.2f} "
        + (f"agree {m['routing_agreement']:.3f} " if m.get("routing_agreement") is not None else "")
        + (f"ref_kl {m['kl_to_reference']:.4f} " if m.get("kl_to_reference") is not None else "")
        + f"stale {m['staleness_max']} ({m['rollout_seconds']:.1f}s rollout, {m['update_seconds']:.1f}s update)"
    )


def sampler_metrics(sampler: Sampler, served_before: tuple[int, int], cfg: Config, step: int) -> dict:
    """The step's warm-up flag and what rank 0's sampler did: requests per engine call this step,
    whether it recorded routing (False: R3 had nothing to replay), the publication gap (vllm)."""
    forwards, requests = served_before
    served = sampler.forwards - forwards  # rank 0's sampler; other ranks sample nothing
    return {
        "warmup": step < warmup_steps(cfg),
        "generation_batch_mean": (sampler.requests - requests) / served if served else None,
        "routing_recorded": sampler.records_routing,
        "publication_gap": sampler.publication_gap,
    }
