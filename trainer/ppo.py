"""PPO for terminal agents, top to bottom, in the shape of CleanRL's ppo.py: ``train`` sets up, then
loops over steps (roll out, update, log); ``ppo_update`` is one update. The arithmetic lives in
``trainer/losses.py`` as pure, table-tested functions; batches in ``trainer/batch.py``; several
processes in ``trainer/distributed.py``; checkpoints in ``trainer/checkpoint.py``; the command
line (and ``--pool``, the whole main job) in ``trainer/cli.py``.

Each step: publish the policy's weights to the generator (version = step), collect a batch of
trajectories through termgym's ``RolloutScheduler`` (TITO: the sampled ids are trained as they
are), recompute log-probs under the current weights and token-level values with the critic, run
GAE over action tokens, whiten the advantages, then several epochs of minibatches of the clipped
policy loss (skipped during the critic warm-up) and the clipped value loss, each model with its own
Adam and its own gradient clipping. ``--kl-coef`` adds a KL penalty to the starting policy;
``--advantage group`` replaces the critic by a leave-one-out baseline over the episodes of the
same task (``--group-size`` launches of each task drawn). With an MoE policy and ``routing_replay`` (R3, on by
default), the log-prob recompute and the policy-loss forwards use the experts the sampler chose at
the sampled tokens (``trainer/routing.py``), and the router's load-balancing loss is off. Metrics
go to ``metrics.jsonl`` and one line per step (``train`` returns every step's); a checkpoint (actor, critic, optimizers, step,
task-pool draws) lets ``--resume`` continue bit-for-bit on CPU.

Multi-process (``torchrun --nproc-per-node N``, gloo on CPU): rank 0 runs the rollouts and
broadcasts the batch; every rank computes GAE on the whole batch identically, takes its share of
each minibatch's rows, and gradients are summed across ranks with losses normalised by the
minibatch's global token count, so N processes compute the same update as one. ``--fsdp`` shards
both models with FSDP2 instead (FSDP reduces the gradients; checkpoints hold whole tensors).
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from rich.console import Console
from torch.distributed.checkpoint.state_dict import get_model_state_dict

from termgym.env import resolve_task
from termgym.errors import ConfigError, TrainingError
from termgym.progress import progress_bar
from termgym.records import append_record
from termgym.sandboxes.pacing import Pacer
from termgym.scheduling.pool import TaskPool, cluster_nodes, make_nodes
from termgym.scheduling.scheduler import (
    BatchResult,
    KeptTrial,
    RolloutScheduler,
    SchedulerConfig,
    step_metrics,
)
from termgym.tasks import Task, load_task
from termgym.tasks.bundled import bundled_task_paths
from termgym.tracking import Tracker
from termgym.trainer import losses
from termgym.trainer.batch import Batch, forward_logp, forward_values, make_batch
from termgym.trainer.checkpoint import load_checkpoint, restore_optimizers, save_checkpoint
from termgym.trainer.config import (
    DEFAULT_MAX_CONTEXT,
    Config,
    check_config,
    max_context_of,
    resolve_max_context,
    warmup_steps,
)
from termgym.trainer.distributed import FULL, shard, sync_gradients, world
from termgym.trainer.models import Critic, build_tiny_policy, context_window, load_policy, policy_renderer
from termgym.trainer.rollout import PolicyRunner, append_trajectories, rollout_options, rollout_settings
from termgym.trainer.routing import disable_router_aux_loss, replay_routing
from termgym.trainer.sampler import BatchedSampler, Sampler
from termgym.trainer.tracking import run_tracker, step_scalars
from termgym.trainer.trajectory import Trajectory, token_drift
from termgym.trainer.vllm_sampler import VllmSampler, policy_head_dim


class CountingPool(TaskPool):
    """The scheduler's task pool, counting draws so that a resumed run can replay them. With
    ``group_size`` k, each task drawn is launched k times in a row (the group advantage's groups)."""

    def __init__(self, tasks, *, shuffle: bool = True, seed: int = 0, group_size: int = 1) -> None:
        super().__init__(tasks, shuffle=shuffle, seed=seed)
        self.drawn = 0  # tasks drawn from the pool's order
        self.group_size = group_size

    def draw(self, n: int) -> list:
        tasks = super().draw(-(-n // self.group_size))
        self.drawn += len(tasks)
        return [task for task in tasks for _ in range(self.group_size)][:n]

    def replay(self, drawn: int) -> None:
        """Draw what an interrupted run had drawn, so the order continues where it stopped."""
        TaskPool.draw(self, drawn)
        self.drawn = drawn


# -- one update ------------------------------------------------------------------------------------


def ppo_update(
    policy, critic, actor_opt, critic_opt, batch: Batch, cfg: Config, *, update_policy: bool, step: int, reference=None
) -> dict:
    """One PPO update on ``batch`` (every rank holds the same batch). Returns its metrics. With a
    ``reference`` model (the starting policy) and ``cfg.kl_coef > 0``, the policy loss adds
    ``kl_coef`` times the token mean of ``losses.kl_to_reference``. With ``cfg.advantage == "group"``
    the critic is neither read nor trained: every token of an episode gets its leave-one-out
    advantage, scaled to unit root mean square over the batch."""
    b_ids, b_attention, b_mask = batch["ids"], batch["attention"], batch["mask"]
    b_routing = batch.get("routing")
    replayed = b_routing if cfg.routing_replay else None  # the experts the forwards are made to take
    replay = replayed is not None
    anchored = reference is not None and cfg.kl_coef > 0
    with_critic = cfg.advantage == "gae"
    with torch.no_grad():
        # agreement is measured either way; the recorded experts are used only with routing_replay
        with replay_routing(policy, b_routing, enforce=replay) as routing_stats:
            b_logp, b_entropy = forward_logp(policy, b_ids, b_attention, entropy=True)
        assert b_entropy is not None  # asked for
        b_values = forward_values(critic, b_ids, b_attention) * b_mask if with_critic else None
        b_ref_logp = None
        if anchored:
            assert reference is not None  # anchored: there is a reference
            with replay_routing(reference, replayed):
                b_ref_logp, _ = forward_logp(reference, b_ids, b_attention)
    if with_critic:
        assert b_values is not None  # computed with the critic
        b_advantages, b_returns = losses.masked_gae(batch["rewards"], b_values, b_mask, cfg.gamma, cfg.lam)
        b_advantages = losses.whiten(b_advantages, b_mask)
    else:
        per_episode = losses.leave_one_out_advantages(batch["episode_rewards"], batch["groups"])
        b_advantages = losses.scale_to_unit(per_episode[batch["row_episode"]][:, None] * b_mask, b_mask)
    metrics = {
        "explained_variance": losses.explained_variance(b_returns, b_values, b_mask) if b_values is not None else None,
        "entropy": float(losses.masked_mean(b_entropy, b_mask)),
        "logprob_gap": float(losses.masked_mean((b_logp - batch["rollout_logp"]).abs(), b_mask)),
        "routing_replay": replay,
        "routing_agreement": routing_stats.agreement,  # None: no routing recorded (a dense policy)
        "kl_to_reference": float(losses.masked_mean(losses.kl_to_reference(b_logp, b_ref_logp), b_mask))
        if b_ref_logp is not None  # set exactly when anchored
        else None,
        # the batch's reward signal: groups (tasks) whose episodes all scored alike, and the spread
        "equal_reward_share": losses.equal_reward_share(batch["episode_rewards"], batch["groups"]),
        "reward_std": float(batch["episode_rewards"].std(correction=0)),  # population std; 0 for one episode
    }
    rank, size = world()
    order = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    b_loss_mask = b_mask * batch["weights"][:, None]  # the scheduler's reweighting, per trajectory
    minibatch_losses: dict[str, list[float]] = {
        "policy_loss": [],
        "value_loss": [],
        "clip_fraction": [],
        "approx_kl": [],  # CleanRL's: how far the policy has moved from b_logp when the minibatch starts
    }
    for _ in range(cfg.update_epochs):
        permutation = torch.randperm(len(b_ids), generator=order)
        for start in range(0, len(b_ids), cfg.minibatch_size):
            mb = permutation[start : start + cfg.minibatch_size]
            share = float(b_loss_mask[mb].sum().clamp(min=1.0))  # the minibatch's tokens, all ranks together
            mine, counted = mb[rank::size], 1.0  # this rank's rows
            if len(mine) == 0:  # a short last minibatch: run one row that counts for nothing, so
                mine, counted = mb[:1], 0.0  # every rank still joins the collectives
            mb_ids, mb_attention, mb_mask = b_ids[mine], b_attention[mine], b_loss_mask[mine] * counted
            # masked means times this scale sum to the minibatch's global mean (FSDP averages: undo it)
            scale = float(mb_mask.sum()) / share * (size if cfg.fsdp else 1)
            if update_policy:
                actor_opt.zero_grad()
                with replay_routing(policy, replayed[mine] if replayed is not None else None):
                    mb_logp, _ = forward_logp(policy, mb_ids, mb_attention)
                pg_loss, clip_fraction = losses.policy_loss(
                    mb_logp, b_logp[mine], b_advantages[mine], mb_mask, cfg.clip
                )
                if anchored:
                    assert b_ref_logp is not None  # computed above when anchored
                    pg_loss = pg_loss + cfg.kl_coef * losses.masked_mean(
                        losses.kl_to_reference(mb_logp, b_ref_logp[mine]), mb_mask
                    )
                (pg_loss * scale).backward()
                if counted:
                    minibatch_losses["policy_loss"].append(float(pg_loss.detach()))
                    minibatch_losses["clip_fraction"].append(float(clip_fraction))
                    minibatch_losses["approx_kl"].append(float(losses.approx_kl(mb_logp, b_logp[mine], mb_mask)))
                sync_gradients(policy)
                torch.nn.utils.clip_grad_norm_(policy.parameters(), cfg.max_grad_norm)
                actor_opt.step()
            if not with_critic:
                continue
            assert b_values is not None  # with the critic
            critic_opt.zero_grad()
            mb_values = forward_values(critic, mb_ids, mb_attention)
            v_loss = losses.value_loss(mb_values, b_values[mine], b_returns[mine], mb_mask, cfg.value_clip)
            (v_loss * scale).backward()
            if counted:
                minibatch_losses["value_loss"].append(float(v_loss.detach()))
            sync_gradients(critic)
            torch.nn.utils.clip_grad_norm_(critic.parameters(), cfg.max_grad_norm)
            critic_opt.step()
    metrics.update({name: (sum(v) / len(v) if v else None) for name, v in minibatch_losses.items()})
    return metrics


# -- the loop --------------------------------------------------------------------------------------


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


def make_sampler(cfg: Config, policy, model_dir: Path, pad_id: int, rank: int) -> Sampler:
    """The rollout's sampler: its own copy of the policy (unsharded, always). With ``--generator
    vllm`` rank 0 starts an engine, with ``--generator server`` rank 0 reaches the server at
    ``--base-url`` (other ranks sample nothing)."""
    if cfg.generator == "server" and rank == 0:
        from termgym.trainer.server_sampler import ServerSampler

        return ServerSampler(copy.deepcopy(policy), cfg.base_url, cfg.served_model, max_context=max_context_of(cfg))
    if cfg.generator == "vllm" and rank == 0:
        sampler = VllmSampler(copy.deepcopy(policy), model_dir, max_context=max_context_of(cfg), seed=cfg.seed)
        if not sampler.records_routing:
            print(f"generator vllm: {sampler.routing_note}", file=sys.stderr)
        return sampler
    sampler_model = copy.deepcopy(policy).to(getattr(torch, cfg.sampler_dtype))  # publish casts into it
    return BatchedSampler(sampler_model, pad_id=pad_id, batched=not cfg.deterministic)


def rollout_nodes(cfg: Config) -> dict[str, Any]:
    """The scheduler's nodes: one of ``cfg.concurrency`` trials on this machine, or with
    ``cfg.cluster`` the Ray cluster's nodes, each with its own cap, and their liveness."""
    if not cfg.cluster:
        return {"nodes": make_nodes([cfg.concurrency])}
    nodes, node_up = cluster_nodes(cfg.cluster, cfg.backend, cpus_per_sandbox=cfg.cpus_per_sandbox)
    return {"nodes": nodes, "node_up": node_up}


def bundled_tasks() -> list[Task]:
    """The bundled tasks: what trains when neither ``--tasks`` nor ``--pool`` says otherwise."""
    return [load_task(path) for path in bundled_task_paths()]


async def train(cfg: Config, tracker: Tracker | None = None) -> list[dict]:
    """Run ``cfg.steps`` steps (continuing from the checkpoint with ``cfg.resume``); returns every
    step this call ran, its metrics in order (on every rank; empty when no step ran). Rank 0 sends
    each step's metrics to ``tracker``, or with ``cfg.track`` to a tracker of its own
    (``trainer/tracking.py``)."""
    check_config(cfg)
    rank, size = world()
    if cfg.batch_size % size or cfg.minibatch_size % size:
        raise ConfigError(f"batch_size and minibatch_size must be multiples of the {size} processes")
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = Path(cfg.model) if cfg.model else out / "init"
    from_model = cfg.max_context is None and bool(cfg.model)  # not given: the model's own window
    window = context_window(model_dir) if from_model else None
    if from_model and rank == 0:
        said = f"the context window of {model_dir}" if window else f"{model_dir}/config.json states no context window"
        print(f"--max-context {window or DEFAULT_MAX_CONTEXT}: {said}", file=sys.stderr)
    cfg = resolve_max_context(cfg, window)
    if not cfg.model and rank == 0 and not (model_dir / "config.json").exists():
        build_tiny_policy(model_dir, seed=cfg.seed, head_dim=policy_head_dim(cfg.generator))
    if size > 1:
        dist.barrier()
    policy, tokenizer = load_policy(model_dir)
    if cfg.routing_replay:
        disable_router_aux_loss(policy)  # fixed routing: nothing to balance (and the loss never adds it anyway)
    # the KL anchor: the policy as loaded, before any update or resumed checkpoint (unsharded, frozen)
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
    critic = Critic(model_dir)
    pad_id = tokenizer.pad_token_id
    assert isinstance(pad_id, int), f"{model_dir}: the trainer pads batches with the tokenizer's pad token"
    sampler = make_sampler(cfg, policy, model_dir, pad_id, rank)
    pool = CountingPool(
        [resolve_task(name) for name in cfg.tasks] or bundled_tasks(), seed=cfg.seed, group_size=cfg.group_size
    )
    state = load_checkpoint(out) if cfg.resume else None
    if state is not None:
        policy.load_state_dict(state["policy"])
        critic.load_state_dict(state["critic"])
    if cfg.fsdp and size > 1:
        shard(policy, policy.model.layers)
        shard(critic, critic.backbone.layers)
    actor_opt = torch.optim.Adam(policy.parameters(), lr=cfg.actor_lr)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    start = 0
    if state is not None:
        restore_optimizers(state, policy, critic, actor_opt, critic_opt)
        pool.replay(state["drawn"])  # the pool's order is a function of its seed and the draws so far
        start = state["step"]
    options = rollout_options(cfg, f"train-{out.name}")
    runner = PolicyRunner(
        sampler,
        policy_renderer(model_dir, tokenizer, cfg),
        options,
        Pacer(),
        rollout_settings(cfg),
        seed=cfg.seed,
        binary_reward=cfg.reward == "binary",
    )
    scheduler_config = SchedulerConfig(
        batch_size=cfg.batch_size,
        launch=cfg.launch,
        mode=cfg.mode,
        clock="work" if cfg.deterministic else "wall",
        **rollout_nodes(cfg),
    )
    history: list[dict] = []
    progress = progress_bar(Console(file=sys.stderr), disable=rank != 0)
    steps_bar = progress.add_task("steps", total=cfg.steps, completed=start)
    trials_bar = progress.add_task("trials", total=cfg.batch_size)

    def on_record(fate: str, record) -> None:
        append_record(out / "records.jsonl", record)
        progress.advance(trials_bar, fate == "kept")

    tracking = run_tracker(cfg, out, tracker) if rank == 0 else contextlib.nullcontext()
    with progress, contextlib.closing(sampler), tracking as tracker:  # the samplers hold processes, connections
        async with RolloutScheduler(runner, pool, scheduler_config, pacer=Pacer(), on_record=on_record) as scheduler:
            for step in range(start, cfg.steps):
                progress.reset(trials_bar, total=cfg.batch_size)
                # 1. publish the weights, then roll out (rank 0) and share the batch
                began = time.monotonic()
                weights = get_model_state_dict(policy, options=FULL)  # a collective when sharded
                if rank == 0:
                    sampler.publish(weights, version=step)
                forwards, requests = sampler.forwards, sampler.requests
                payload: list[tuple[list[KeptTrial[Trajectory]], BatchResult[Trajectory]] | None] = [None]
                if rank == 0:
                    result = await scheduler.step(policy_version=step)
                    kept = sorted(result.kept, key=lambda k: k.result.launch)  # a batch order that timing cannot change
                    payload = [(kept, result)]
                if size > 1:
                    dist.broadcast_object_list(payload, src=0)
                shared = payload[0]
                assert shared is not None  # rank 0's, broadcast to every rank
                kept, result = shared
                if not kept:
                    raise TrainingError(f"step {step}: no trajectory finished (see {out / 'records.jsonl'})")
                rollout_seconds = time.monotonic() - began
                # 2. the PPO update (critic only during the warm-up)
                began = time.monotonic()
                batch = make_batch(
                    [k.result for k in kept], [k.weight for k in kept], pad_id, max_context=cfg.max_context
                )
                update = ppo_update(
                    policy,
                    critic,
                    actor_opt,
                    critic_opt,
                    batch,
                    cfg,
                    update_policy=step >= warmup_steps(cfg),
                    step=step,
                    reference=reference,
                )
                timings = {"rollout_seconds": rollout_seconds, "update_seconds": time.monotonic() - began}
                # 3. metrics, trajectories, checkpoint
                metrics = summarise(step, kept, update, result, timings)
                metrics["warmup"] = step < warmup_steps(cfg)
                served = sampler.forwards - forwards  # rank 0's sampler; other ranks sample nothing
                metrics["generation_batch_mean"] = (sampler.requests - requests) / served if served else None
                metrics["routing_recorded"] = sampler.records_routing  # False: R3 had nothing to replay
                metrics["publication_gap"] = sampler.publication_gap  # vllm: engine vs trainer
                if rank == 0:
                    append_trajectories(out / "trajectories.jsonl", [k.result for k in kept], step)
                    with open(out / "metrics.jsonl", "a", encoding="utf-8") as handle:
                        handle.write(json.dumps(metrics) + "\n")
                    if tracker is not None:
                        tracker.log(step_scalars(metrics), step + 1)
                    progress.console.print(progress_line(metrics, cfg.steps), highlight=False, soft_wrap=True)
                    progress.advance(steps_bar)
                history.append(metrics)
                if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
                    save_checkpoint(
                        out, step + 1, pool.drawn, policy, critic, actor_opt, critic_opt, sampler.model, tokenizer, cfg
                    )
    return history
