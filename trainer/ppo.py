"""PPO for terminal agents, top to bottom, in the shape of CleanRL's ppo.py: ``train`` sets up, then
loops over steps (roll out, update, log); ``ppo_update`` is one update. The arithmetic lives in
``trainer/losses.py`` as pure, table-tested functions; batches in ``trainer/batch.py``; several
processes in ``trainer/distributed.py``; checkpoints in ``trainer/checkpoint.py``; a step's metrics
in ``trainer/metrics.py``; the command line in ``trainer/cli.py``. Each feature of the update is a
small function ``ppo_update`` calls: rank sharding (``rank_share``), the KL anchor (``kl_anchor``),
the group baseline (``group_advantages``) and routing replay (``replayed_routing``).

Each step publishes the policy's weights to the generator (version = step), collects a batch
through termgym's ``RolloutScheduler`` (TITO: the sampled ids are trained as they are), and updates
actor and critic (each with its own Adam and gradient clipping). Guarantees: a checkpoint lets
``--resume`` continue bit-for-bit on CPU; N processes (``torchrun``) compute the same update as one.

The step and the options (``--kl-coef``, ``--advantage group``, R3, ``--fsdp``):
docs/guides/training.md#ppo, #routing-replay-r3 and #multi-process."""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

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
)
from termgym.tasks import Task, load_task
from termgym.tasks.bundled import bundled_task_paths
from termgym.tracking import Tracker

from . import losses
from .batch import Batch, forward_logp, forward_values, make_batch
from .checkpoint import load_checkpoint, restore_optimizers, save_checkpoint
from .checks import check_config
from .config import DEFAULT_MAX_CONTEXT, Config, max_context_of, resolve_max_context, warmup_steps
from .distributed import FULL, shard, sync_gradients, world
from .metrics import progress_line, sampler_metrics, summarise
from .models import Critic, build_tiny_policy, context_window, load_policy, policy_renderer
from .rollout import PolicyRunner, append_trajectories, rollout_options, rollout_settings
from .routing import disable_router_aux_loss, replay_routing
from .sampler import BatchedSampler, Sampler
from .tracking import run_tracker, step_scalars
from .trajectory import Trajectory
from .vllm_sampler import VllmSampler, policy_head_dim


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


@dataclass(frozen=True)
class BatchForwards:
    """What the update reads of the batch under the weights it starts from (no gradient): the
    log-probs and entropy, the critic's values (without a critic: None), the reference's log-probs
    (without the KL anchor: None) and how often the policy's router agreed with the sampler's."""

    logp: torch.Tensor
    entropy: torch.Tensor
    values: torch.Tensor | None
    ref_logp: torch.Tensor | None
    routing_agreement: float | None


class RankShare(NamedTuple):
    """Rank sharding: this rank's rows of a minibatch, their loss mask, the scale that makes the
    ranks' masked means sum to the minibatch's global token mean, and whether the rows count."""

    rows: torch.Tensor
    mask: torch.Tensor
    scale: float
    counted: bool


def replayed_routing(batch: Batch, cfg: Config) -> torch.Tensor | None:
    """Routing replay (R3): the experts the sampler chose, which the forwards are made to take;
    None without ``cfg.routing_replay`` or with nothing recorded (a dense policy)."""
    return batch.get("routing") if cfg.routing_replay else None


def rows_of(routing: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor | None:
    """The replayed routing of ``rows`` (None: nothing replayed)."""
    return routing[rows] if routing is not None else None


def forward_batch(policy, critic, reference, batch: Batch, replayed, *, with_critic: bool) -> BatchForwards:
    """The no-gradient forwards over the whole batch. The router's agreement with the sampler is
    measured either way; the recorded experts are enforced only when ``replayed``."""
    ids, attention = batch["ids"], batch["attention"]
    with torch.no_grad():
        with replay_routing(policy, batch.get("routing"), enforce=replayed is not None) as routing_stats:
            logp, entropy = forward_logp(policy, ids, attention, entropy=True)
        assert entropy is not None  # asked for
        values = forward_values(critic, ids, attention) * batch["mask"] if with_critic else None
        ref_logp = None
        if reference is not None:
            with replay_routing(reference, replayed):
                ref_logp, _ = forward_logp(reference, ids, attention)
    return BatchForwards(logp, entropy, values, ref_logp, routing_stats.agreement)


def gae_advantages(batch: Batch, values: torch.Tensor, cfg: Config) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the critic's token values, the advantages whitened; ``(advantages, returns)``."""
    advantages, returns = losses.masked_gae(batch["rewards"], values, batch["mask"], cfg.gamma, cfg.lam)
    return losses.whiten(advantages, batch["mask"]), returns


def group_advantages(batch: Batch) -> torch.Tensor:
    """The group baseline (``--advantage group``): each episode's reward minus the mean of the other
    episodes of its task (leave-one-out) on each of its tokens, scaled to unit root mean square."""
    per_episode = losses.leave_one_out_advantages(batch["episode_rewards"], batch["groups"])
    return losses.scale_to_unit(per_episode[batch["row_episode"]][:, None] * batch["mask"], batch["mask"])


def batch_metrics(batch: Batch, forwards: BatchForwards, returns: torch.Tensor | None, replayed) -> dict:
    """What the update measures before its first step, the batch's reward signal included."""
    mask, values, ref_logp = batch["mask"], forwards.values, forwards.ref_logp
    return {
        "explained_variance": losses.explained_variance(returns, values, mask)
        if values is not None and returns is not None  # with the critic
        else None,
        "entropy": float(losses.masked_mean(forwards.entropy, mask)),
        "logprob_gap": float(losses.masked_mean((forwards.logp - batch["rollout_logp"]).abs(), mask)),
        "routing_replay": replayed is not None,
        "routing_agreement": forwards.routing_agreement,  # None: no routing recorded (a dense policy)
        "kl_to_reference": float(losses.masked_mean(losses.kl_to_reference(forwards.logp, ref_logp), mask))
        if ref_logp is not None
        else None,
        # the batch's reward signal: groups (tasks) whose episodes all scored alike, and the spread
        "equal_reward_share": losses.equal_reward_share(batch["episode_rewards"], batch["groups"]),
        "reward_std": float(batch["episode_rewards"].std(correction=0)),  # population std; 0 for one episode
    }


def rank_share(minibatch: torch.Tensor, loss_mask: torch.Tensor, cfg: Config) -> RankShare:
    """This rank's share of ``minibatch`` (every ``size``-th row). A short last minibatch may leave
    a rank none: it then runs one row that counts for nothing, so every rank joins the collectives.
    FSDP averages the gradients where the ranks' sum is wanted: the scale undoes it."""
    rank, size = world()
    tokens = float(loss_mask[minibatch].sum().clamp(min=1.0))  # the minibatch's tokens, all ranks together
    rows, counted = minibatch[rank::size], 1.0
    if len(rows) == 0:
        rows, counted = minibatch[:1], 0.0
    mask = loss_mask[rows] * counted
    return RankShare(rows, mask, float(mask.sum()) / tokens * (size if cfg.fsdp else 1), bool(counted))


def kl_anchor(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, cfg: Config) -> torch.Tensor:
    """The KL anchor: ``kl_coef`` times the token mean of the KL to the starting policy."""
    return cfg.kl_coef * losses.masked_mean(losses.kl_to_reference(logp, ref_logp), mask)


def step_model(model, optimizer, loss: torch.Tensor, scale: float, cfg: Config) -> None:
    """Backward (``loss`` scaled to its share of the minibatch), sum the gradients across ranks,
    clip them, step ``optimizer``."""
    (loss * scale).backward()
    sync_gradients(model)
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()


def ppo_update(
    policy, critic, actor_opt, critic_opt, batch: Batch, cfg: Config, *, update_policy: bool, step: int, reference=None
) -> dict:
    """One PPO update on ``batch`` (every rank holds the same batch). Returns its metrics. With a
    ``reference`` model (the starting policy) and ``cfg.kl_coef > 0``, the policy loss adds the KL
    anchor. With ``cfg.advantage == "group"`` the critic is neither read nor trained: the group
    baseline gives the advantages."""
    replayed = replayed_routing(batch, cfg)
    with_critic = cfg.advantage == "gae"
    anchor = reference if reference is not None and cfg.kl_coef > 0 else None
    b = forward_batch(policy, critic, anchor, batch, replayed, with_critic=with_critic)
    if b.values is not None:
        advantages, returns = gae_advantages(batch, b.values, cfg)
    else:
        advantages, returns = group_advantages(batch), None
    metrics = batch_metrics(batch, b, returns, replayed)
    ids, attention = batch["ids"], batch["attention"]
    loss_mask = batch["mask"] * batch["weights"][:, None]  # the scheduler's reweighting, per trajectory
    order = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    logged: dict[str, list[float]] = {"policy_loss": [], "value_loss": [], "clip_fraction": [], "approx_kl": []}
    for _ in range(cfg.update_epochs):
        permutation = torch.randperm(len(ids), generator=order)
        for start in range(0, len(ids), cfg.minibatch_size):
            mine = rank_share(permutation[start : start + cfg.minibatch_size], loss_mask, cfg)
            rows, mask = mine.rows, mine.mask
            if update_policy:
                actor_opt.zero_grad()
                with replay_routing(policy, rows_of(replayed, rows)):
                    logp, _ = forward_logp(policy, ids[rows], attention[rows])
                pg_loss, clip_fraction = losses.policy_loss(logp, b.logp[rows], advantages[rows], mask, cfg.clip)
                if b.ref_logp is not None:
                    pg_loss = pg_loss + kl_anchor(logp, b.ref_logp[rows], mask, cfg)
                if mine.counted:
                    logged["policy_loss"].append(float(pg_loss.detach()))
                    logged["clip_fraction"].append(float(clip_fraction))
                    # CleanRL's approx_kl: how far the policy has moved from b.logp when the minibatch starts
                    logged["approx_kl"].append(float(losses.approx_kl(logp, b.logp[rows], mask)))
                step_model(policy, actor_opt, pg_loss, mine.scale, cfg)
            if b.values is None or returns is None:  # the group baseline: no critic
                continue
            critic_opt.zero_grad()
            values = forward_values(critic, ids[rows], attention[rows])
            v_loss = losses.value_loss(values, b.values[rows], returns[rows], mask, cfg.value_clip)
            if mine.counted:
                logged["value_loss"].append(float(v_loss.detach()))
            step_model(critic, critic_opt, v_loss, mine.scale, cfg)
    metrics.update({name: (sum(v) / len(v) if v else None) for name, v in logged.items()})
    return metrics


# -- set-up ----------------------------------------------------------------------------------------


def make_sampler(cfg: Config, policy, model_dir: Path, pad_id: int, rank: int) -> Sampler:
    """The rollout's sampler: its own copy of the policy (unsharded, always). With ``--generator
    vllm`` rank 0 starts an engine, with ``--generator server`` rank 0 reaches the server at
    ``--base-url`` (other ranks sample nothing)."""
    if cfg.generator == "server" and rank == 0:
        from .server_sampler import ServerSampler

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


def check_world(cfg: Config) -> tuple[int, int]:
    """This process's rank and the number of processes, once the batch divides among them."""
    rank, size = world()
    if cfg.batch_size % size or cfg.minibatch_size % size:
        raise ConfigError(f"batch_size and minibatch_size must be multiples of the {size} processes")
    return rank, size


def prepare_model_dir(cfg: Config, out: Path, rank: int) -> tuple[Config, Path]:
    """``cfg`` with its context window resolved, and the policy's directory: ``--model``, else
    ``OUT/init``, where rank 0 builds the tiny policy unless one is there (a resumed run)."""
    model_dir = Path(cfg.model) if cfg.model else out / "init"
    from_model = cfg.max_context is None and bool(cfg.model)  # not given: the model's own window
    window = context_window(model_dir) if from_model else None
    if from_model and rank == 0:
        said = f"the context window of {model_dir}" if window else f"{model_dir}/config.json states no context window"
        print(f"--max-context {window or DEFAULT_MAX_CONTEXT}: {said}", file=sys.stderr)
    cfg = resolve_max_context(cfg, window)
    if not cfg.model and rank == 0 and not (model_dir / "config.json").exists():
        build_tiny_policy(model_dir, seed=cfg.seed, head_dim=policy_head_dim(cfg.generator))
    if world()[1] > 1:
        dist.barrier()
    return cfg, model_dir


def load_models(cfg: Config, model_dir: Path):
    """The policy and its tokenizer's pad id, the KL anchor's reference (the policy as loaded,
    before any update or resumed checkpoint; unsharded, frozen; None without ``--kl-coef``), and
    the critic."""
    policy, tokenizer = load_policy(model_dir)
    if cfg.routing_replay:
        disable_router_aux_loss(policy)  # fixed routing: nothing to balance (and the loss never adds it anyway)
    reference = copy.deepcopy(policy).eval().requires_grad_(False) if cfg.kl_coef > 0 else None
    critic = Critic(model_dir)
    pad_id = tokenizer.pad_token_id
    assert isinstance(pad_id, int), f"{model_dir}: the trainer pads batches with the tokenizer's pad token"
    return policy, tokenizer, pad_id, reference, critic


def optimizers(cfg: Config, out: Path, policy, critic, pool: CountingPool) -> tuple[Any, Any, int]:
    """Both Adams and the first step: from ``OUT/checkpoint.pt`` with ``--resume`` (weights,
    optimizers, the pool's draws), else fresh; the models sharded first with ``--fsdp``."""
    state = load_checkpoint(out) if cfg.resume else None
    if state is not None:
        policy.load_state_dict(state["policy"])
        critic.load_state_dict(state["critic"])
    if cfg.fsdp and world()[1] > 1:
        shard(policy, policy.model.layers)
        shard(critic, critic.backbone.layers)
    actor_opt = torch.optim.Adam(policy.parameters(), lr=cfg.actor_lr)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=cfg.critic_lr)
    if state is None:
        return actor_opt, critic_opt, 0
    restore_optimizers(state, policy, critic, actor_opt, critic_opt)
    pool.replay(state["drawn"])  # the pool's order is a function of its seed and the draws so far
    return actor_opt, critic_opt, state["step"]


def creation_pacer(cfg: Config) -> Pacer:
    """The pacer of the rollouts' sandbox creations: the published quota (6 a second, 600 a minute)
    for sandboxes a provider or a daemon makes; none for the embedded backend's, the job's own
    processes (at most a node's cap at once: ``--concurrency`` here). Pacing only times creations:
    on the deterministic work clock what a step keeps and samples is the same either way."""
    return Pacer(() if cfg.backend == "local" else None)


def policy_runner(
    cfg: Config, sampler: Sampler, model_dir: Path, tokenizer, out: Path, pacer: Pacer | None = None
) -> PolicyRunner:
    """What the scheduler runs for each trial: one policy episode through ``sampler``, each sandbox
    created when ``pacer`` grants it (default: ``creation_pacer``)."""
    options = rollout_options(cfg, f"train-{out.name}")
    renderer = policy_renderer(model_dir, tokenizer, cfg)
    return PolicyRunner(
        sampler,
        renderer,
        options,
        pacer if pacer is not None else creation_pacer(cfg),
        rollout_settings(cfg),
        seed=cfg.seed,
        binary_reward=cfg.reward == "binary",
    )


def scheduler_config(cfg: Config) -> SchedulerConfig:
    """A step's batch: ``cfg.batch_size`` kept of the trials launched, by simulated work (``--deterministic``)."""
    clock = "work" if cfg.deterministic else "wall"
    return SchedulerConfig(
        batch_size=cfg.batch_size, launch=cfg.launch, mode=cfg.mode, clock=clock, **rollout_nodes(cfg)
    )


# -- the loop's steps ------------------------------------------------------------------------------


async def roll_out(scheduler: RolloutScheduler, step: int, out: Path) -> tuple[list[KeptTrial], BatchResult]:
    """Rank 0 runs a step's rollouts and broadcasts the batch (kept trials in launch order, an order
    timing cannot change); every rank returns it."""
    rank, size = world()
    payload: list[tuple[list[KeptTrial[Trajectory]], BatchResult[Trajectory]] | None] = [None]
    if rank == 0:
        result = await scheduler.step(policy_version=step)
        payload = [(sorted(result.kept, key=lambda k: k.result.launch), result)]
    if size > 1:
        dist.broadcast_object_list(payload, src=0)
    shared = payload[0]
    assert shared is not None  # rank 0's, broadcast to every rank
    if not shared[0]:
        raise TrainingError(f"step {step}: no trajectory finished (see {out / 'records.jsonl'})")
    return shared


def write_step(out: Path, metrics: dict, kept: list[KeptTrial[Trajectory]], step: int, tracker) -> None:
    """Rank 0: the step's trajectories, its line of ``metrics.jsonl``, and the tracker's scalars."""
    append_trajectories(out / "trajectories.jsonl", [k.result for k in kept], step)
    with open(out / "metrics.jsonl", "a", encoding="utf-8") as handle:
        handle.write(json.dumps(metrics) + "\n")
    if tracker is not None:
        tracker.log(step_scalars(metrics), step + 1)


async def train(cfg: Config, tracker: Tracker | None = None) -> list[dict]:
    """Run ``cfg.steps`` steps (continuing from the checkpoint with ``cfg.resume``); returns every
    step this call ran, its metrics in order (on every rank; empty when no step ran). Rank 0 sends
    each step's metrics to ``tracker``, or with ``cfg.track`` to a tracker of its own
    (``trainer/tracking.py``)."""
    check_config(cfg)
    rank, _ = check_world(cfg)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg, model_dir = prepare_model_dir(cfg, out, rank)
    policy, tokenizer, pad_id, reference, critic = load_models(cfg, model_dir)
    sampler = make_sampler(cfg, policy, model_dir, pad_id, rank)
    tasks = [resolve_task(name) for name in cfg.tasks] or bundled_tasks()
    pool = CountingPool(tasks, seed=cfg.seed, group_size=cfg.group_size)
    actor_opt, critic_opt, start = optimizers(cfg, out, policy, critic, pool)
    pacer = creation_pacer(cfg)  # one for the runner's creations and the scheduler's accounting of them
    runner = policy_runner(cfg, sampler, model_dir, tokenizer, out, pacer)
    config = scheduler_config(cfg)
    history: list[dict] = []
    progress = progress_bar(Console(file=sys.stderr), disable=rank != 0)
    steps_bar = progress.add_task("steps", total=cfg.steps, completed=start)
    trials_bar = progress.add_task("trials", total=cfg.batch_size)

    def on_record(fate: str, record) -> None:
        append_record(out / "records.jsonl", record)
        progress.advance(trials_bar, fate == "kept")

    tracking = run_tracker(cfg, out, tracker) if rank == 0 else contextlib.nullcontext()
    with progress, contextlib.closing(sampler), tracking as tracker:  # the samplers hold processes, connections
        async with RolloutScheduler(runner, pool, config, pacer=pacer, on_record=on_record) as scheduler:
            for step in range(start, cfg.steps):
                progress.reset(trials_bar, total=cfg.batch_size)
                # 1. publish the weights (version = step), then roll out on rank 0 and share the batch
                began = time.monotonic()
                weights = get_model_state_dict(policy, options=FULL)  # a collective when sharded
                if rank == 0:
                    sampler.publish(weights, version=step)
                served_before = sampler.forwards, sampler.requests
                kept, result = await roll_out(scheduler, step, out)
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
                metrics = summarise(step, kept, update, result, timings) | sampler_metrics(
                    sampler, served_before, cfg, step
                )
                if rank == 0:
                    write_step(out, metrics, kept, step, tracker)
                    progress.console.print(progress_line(metrics, cfg.steps), highlight=False, soft_wrap=True)
                    progress.advance(steps_bar)
                history.append(metrics)
                if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
                    save_checkpoint(
                        out, step + 1, pool.drawn, policy, critic, actor_opt, critic_opt, sampler.model, tokenizer, cfg
                    )
    return history
