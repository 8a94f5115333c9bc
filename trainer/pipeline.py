"""The main job, end to end (``termgym train --preset tiny``, what ``make demo`` runs):

1. generate a training pool and a held-out set from the task families (``envs/families``);
2. audit the pool (``termgym audit``'s mechanical checks); only accepted tasks train;
3. copy the ``--init`` model or build a tiny MoE policy;
4. record the demonstrations of the accepted tasks (all but the ``--ppo-pool`` ones) in real
   sandboxes and train on them (the supervised warm start; ``trainer/demonstrations.py``); with
   ``--start-floor``, check the start on a validation split;
5. evaluate on the held-out set, greedily and with ``--eval-samples`` sampled episodes, and the
   teacher on the same tasks (``trainer/held_out.py``, as phase 7);
6. critic warm-up, then PPO with the dense per-assertion reward (``trainer/ppo.py``);
7. evaluate again; write the curves, ``summary.json``, and print the final table.

Honesty: nothing of the held-out set reaches training (different names by construction, one
held-out family never trained on, neither set in the tokenizer's corpus, no held-out trial updates
weights); nothing is tuned on it here: it is evaluated twice, with the same greedy decoding.
The phases in full and the run directory's layout: docs/guides/training.md#the-main-job-make-demo."""

from __future__ import annotations

import itertools
import json
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rich.console import Console

from termgym.audit.cache import AuditCache
from termgym.audit.rubric import select_order, with_audited_count
from termgym.audit.runner import audit_tasks
from termgym.envs.families import bundled_audit_cache, generate_split
from termgym.errors import ConfigError, TermgymError
from termgym.progress import progress_bar
from termgym.tasks import Task, load_task
from termgym.tracking import Tracker

from .config import Config, init_dir, resolve_max_context, warmup_steps
from .demonstrations import imported_demonstrations, record_demonstrations, teacher_held_out
from .evaluate import paired_change
from .held_out import check_start, family_table, held_out, result_table, validation_share_reached
from .models import build_tiny_policy, load_policy, policy_renderer
from .plots import write_family_plot, write_plots
from .ppo import train
from .rollout import rollout_options
from .sft import Demonstration, supervised_steps
from .tracking import log_heldout, log_job, run_tracker
from .vllm_sampler import policy_head_dim


@dataclass
class Pool:
    """The generated tasks and the audit's verdict on the training pool."""

    train: list[Task]
    heldout: list[Task]
    selection: list[Task]  # accepted training tasks, best audit score first
    verdicts: list
    validation: list[Task] = field(default_factory=list)  # with sft_stop_share or start_floor; never trained on


async def prepare_pool(run: Path, cfg: Config, console: Console) -> Pool:
    """Phases 1 and 2: write ``run/tasks/{train,heldout}``, audit the training pool, write
    ``audit.json`` and ``selection.txt``."""

    def split(name: str, count: int) -> list[Task]:
        paths = generate_split(run / "tasks" / name, name, count, cfg.seed, family_set=cfg.families)
        return [load_task(p) for p in paths]

    train_tasks, heldout = split("train", cfg.pool), split("heldout", cfg.heldout) if cfg.heldout else []
    validation = validation_split(run, cfg) if cfg.sft_stop_share or cfg.start_floor else []
    console.print(f"[bold]1/7 tasks[/]: {len(train_tasks)} training, {len(heldout)} held-out ({run / 'tasks'})")
    with progress_bar(console) as progress:
        bar = progress.add_task("2/7 audit of the training pool", total=1)
        cache = (
            AuditCache.load(bundled_audit_cache() if cfg.audit_cache == "bundled" else cfg.audit_cache)
            if cfg.audit_cache
            else AuditCache()
        )
        verdicts = await audit_tasks(
            train_tasks,
            rollout_options(cfg, f"audit-{run.name}"),
            k=cfg.audit_k,
            concurrency=max(1, cfg.concurrency // 2),
            cache=cache,
        )
        progress.update(bar, completed=1)
    cache.save(run / "audit-cache.json")
    if cache.hits:
        console.print(f"  {cache.hits} verdicts from the audit cache (the same task files, audited before)")
    (run / "audit.json").write_text(json.dumps([v.to_dict() for v in verdicts], indent=2) + "\n")
    by_name = {task.name: task for task in train_tasks}
    audited = {verdict.task: verdict for verdict in verdicts}
    selection = [with_audited_count(by_name[name], audited[name]) for name in select_order(verdicts)]
    (run / "selection.txt").write_text("".join(f"{task.path}\n" for task in selection))
    rejected = [v for v in verdicts if not v.accepted]
    console.print(
        f"  accepted {len(selection)}/{len(verdicts)}"
        + "".join(
            f"\n  rejected {v.task}: {'; '.join(r.reason for r in v.rejects) or 'low score'}" for v in rejected[:5]
        )
    )
    if not selection:
        raise TermgymError(f"the audit accepted no task of the pool (see {run / 'audit.json'})")
    return Pool(train_tasks, heldout, selection, verdicts, validation)


def kept_for_ppo(selection: list[Task], count: int) -> tuple[list[Task], list[Task]]:
    """Pure: ``selection`` as (the supervised start's tasks, PPO's): ``count`` tasks spread evenly
    over it are PPO's (every task both's when ``count`` is 0 or leaves the start none)."""
    if count <= 0 or count >= len(selection):
        return selection, selection
    chosen = {int(i * len(selection) / count) for i in range(count)}
    return [t for i, t in enumerate(selection) if i not in chosen], [t for i, t in enumerate(selection) if i in chosen]


def validation_split(run: Path, cfg: Config) -> list[Task]:
    """``cfg.sft_validation`` tasks of the training split's name space that follow the pool's
    (``generate_split``'s ``first``: none of them is in the pool), in ``run/tasks/validation``; not
    audited (every task of the families' shipped pools is accepted)."""
    paths = generate_split(
        run / "tasks" / "validation", "train", cfg.sft_validation, cfg.seed, first=cfg.pool, family_set=cfg.families
    )
    return [load_task(p) for p in paths]


def build_policy(run: Path, cfg: Config, console: Console):
    """Phase 3: the policy in ``run/init``: a copy of ``--init``'s model, or a freshly built tiny
    MoE. Its tokenizer is trained on the bundled tasks' text, never on the generated pool or the
    held-out set: names then split into generic pieces that the policy can learn to copy, instead
    of pool names merged into tokens that no held-out name uses."""
    if cfg.init:
        source = init_dir(cfg)  # a model directory: check_config saw its config.json
        shutil.copytree(source, run / "init")
        policy, tokenizer = load_policy(run / "init")
        params = sum(p.numel() for p in policy.parameters())
        console.print(f"[bold]3/7 policy[/]: {source.name} ({source}), {params / 1e3:.0f}k parameters")
        return policy, tokenizer
    init = build_tiny_policy(
        run / "init",
        seed=cfg.seed,
        hidden=cfg.hidden,
        layers=cfg.layers,
        experts=cfg.experts,
        head_dim=policy_head_dim(cfg.generator),
    )
    policy, tokenizer = load_policy(init)
    params = sum(p.numel() for p in policy.parameters())
    console.print(
        f"[bold]3/7 policy[/]: tiny Qwen3-MoE, {params / 1e3:.0f}k parameters, "
        f"{cfg.layers} layers x {cfg.experts} experts (top-2), vocabulary {len(tokenizer)}"
    )
    return policy, tokenizer


async def first_demonstrations(run: Path, cfg: Config, renderer, console: Console) -> list[Demonstration]:
    """Phase 4a's first part, with ``cfg.sft_first_families``: the reference trajectories of a
    pool of ``cfg.sft_first_pool`` training tasks of that family set (drawn with the run's seed
    from the training split's name space, audited like the pool), in ``run/first``; else none."""
    if not cfg.sft_first_families:
        return []
    first = replace(cfg, families=cfg.sft_first_families, pool=cfg.sft_first_pool, heldout=0)
    pool = await prepare_pool(run / "first", first, console)
    return await record_demonstrations(run / "first", first, pool.selection, renderer, console)


async def warm_start(
    run: Path,
    cfg: Config,
    demos: list[Demonstration],
    policy,
    tokenizer,
    console: Console,
    first: list[Demonstration] | None = None,
    stop: Callable[[int], Awaitable[bool]] | None = None,
) -> list[float]:
    """Phase 4b: train ``policy`` on ``first`` for ``cfg.sft_first_steps`` steps when there are
    any, then on ``demos`` for ``cfg.sft_steps`` steps (each stage with its own learning-rate
    warm-up), and save it to ``run/sft/policy``; returns the loss of every step, in order. With
    ``stop``, the second stage is checked every ``cfg.sft_check_every`` of its steps (``stop`` is
    given their count, the policy in evaluation mode) and ends at the first check that is true."""
    stages: list[tuple[list[Demonstration], int, Callable[[int], Awaitable[bool]] | None]] = (
        [(first, cfg.sft_first_steps, None)] if first else []
    )
    stages.append((demos, cfg.sft_steps, stop))
    began = time.monotonic()
    losses: list[float] = []
    for number, (stage, steps, stopping) in enumerate(stages, start=1):
        label = f"4/7 supervised warm start{f' ({number}/{len(stages)})' if len(stages) > 1 else ''}"
        training = supervised_steps(
            policy,
            [(demo.ids, demo.mask) for demo in stage],
            steps=steps,
            batch_size=cfg.sft_batch_size,
            lr=cfg.sft_lr,
            seed=cfg.seed,
            pad_id=tokenizer.pad_token_id,
        )
        taken = 0
        while taken < steps:
            chunk = min(steps - taken, cfg.sft_check_every if stopping is not None else steps)
            with progress_bar(console) as progress:  # closed during a check: one live display at a time
                bar = progress.add_task(f"{label} on {len(stage)} trajectories", total=steps, completed=taken)
                for loss in itertools.islice(training, chunk):
                    losses.append(loss)
                    taken += 1
                    progress.update(bar, advance=1, description=f"{label} · loss {loss:.3f}")
            if stopping is not None:
                policy.eval()
                if await stopping(taken):
                    break
    policy.eval()
    policy.save_pretrained(run / "sft" / "policy")
    tokenizer.save_pretrained(run / "sft" / "policy")
    (run / "sft" / "losses.json").write_text(json.dumps(losses) + "\n")
    if losses:
        console.print(
            f"  loss {losses[0]:.3f} -> {losses[-1]:.3f} in {len(losses)} steps ({time.monotonic() - began:.0f}s)"
        )
    return losses


async def reinforce(
    cfg: Config, model_dir: Path, selection: list[Task], out: Path, tracker: Tracker | None = None
) -> list[dict]:
    """Phase 6: critic warm-up and PPO from ``model_dir`` on ``selection`` into ``out`` (each
    step's metrics to ``tracker`` when there is one); returns the per-step metrics."""
    return await train(
        replace(
            cfg, model=str(model_dir), tasks=tuple(str(t.path) for t in selection), out=str(out), pool=0, sft_data=""
        ),
        tracker,
    )


async def run_pipeline(cfg: Config, console: Console | None = None) -> dict:
    """Run every phase into ``cfg.out`` (which must not hold an earlier run); returns the summary
    that ``summary.json`` holds. With ``cfg.track``, the job is one tracked run in ``cfg.out``:
    PPO's steps, then the held-out results at the last step (``trainer/tracking.py``)."""
    run = Path(cfg.out)
    if run.exists() and any(run.iterdir()):
        raise ConfigError(f"{run} already holds a run; choose another --out")
    if cfg.resume:
        raise ConfigError(
            "--resume continues PPO alone: give it --out RUN/ppo and --model RUN/sft/policy, without --pool"
        )
    with run_tracker(cfg, run) as tracker:
        return await _run_phases(cfg, console, tracker)


async def _run_phases(cfg: Config, console: Console | None, tracker: Tracker | None) -> dict:
    console = console or Console(
        file=sys.stderr, width=None if sys.stderr.isatty() else 120
    )  # tables unwrapped in logs
    run = Path(cfg.out)
    cfg = resolve_max_context(cfg, None)  # the tiny policy's, for every phase (PPO's --model is its own)
    timings: dict[str, float] = {}
    began = time.monotonic()
    pool = await prepare_pool(run, cfg, console)
    timings["tasks_and_audit"] = time.monotonic() - began
    policy, tokenizer = build_policy(run, cfg, console)
    renderer = policy_renderer(run / "init", tokenizer, cfg)
    began = time.monotonic()
    first = await first_demonstrations(run, cfg, renderer, console)
    supervised, reinforced = kept_for_ppo(pool.selection, cfg.ppo_pool)
    if cfg.sft_data:
        demos = imported_demonstrations(run, cfg, renderer, console)
    else:
        demos = await record_demonstrations(run, cfg, supervised, renderer, console)
    stopping = pool.validation and cfg.sft_stop_share
    stop = validation_share_reached(run, cfg, policy, renderer, pool.validation, console) if stopping else None
    losses = await warm_start(run, cfg, demos, policy, tokenizer, console, first, stop)
    timings["supervised"] = time.monotonic() - began
    start_check = await check_start(run, cfg, policy, renderer, pool.validation, console) if cfg.start_floor else None
    began = time.monotonic()
    before = await held_out(run, cfg, "sft", policy, renderer, pool.heldout, console)
    teacher = (
        await teacher_held_out(run, cfg, renderer, pool.heldout, console) if cfg.demonstrations == "teacher" else None
    )
    timings["evaluation"] = time.monotonic() - began
    began = time.monotonic()
    console.print(
        f"[bold]6/7 PPO[/]: {warmup_steps(cfg)} critic warm-up steps, then {cfg.steps - warmup_steps(cfg)} "
        f"policy updates, {cfg.batch_size} trajectories per step ({cfg.mode}, {cfg.reward} reward)"
    )
    metrics = await reinforce(cfg, run / "sft" / "policy", reinforced, run / "ppo", tracker)
    timings["ppo"] = time.monotonic() - began
    began = time.monotonic()
    trained, _ = load_policy(run / "ppo" / "policy")
    after = await held_out(run, cfg, "ppo", trained, renderer, pool.heldout, console)
    timings["evaluation"] += time.monotonic() - began
    plots = write_plots(run / "plots", metrics, sft_losses=losses, warmup_steps=warmup_steps(cfg))
    evaluations = {"supervised start": before.greedy, "after PPO": after.greedy}
    if teacher is not None:
        evaluations["teacher"] = teacher
    families = {label: summary.families for label, summary in evaluations.items()}
    tracked = {"sft": before.greedy, "ppo": after.greedy, **({"teacher": teacher} if teacher is not None else {})}
    if before.sampled and after.sampled:
        tracked.update({"sft-sampled": before.sampled, "ppo-sampled": after.sampled})
    log_heldout(tracker, tracked, cfg.steps)  # summary.json's labels, at PPO's last step
    plots.append(write_family_plot(run / "plots" / "heldout_families.png", families))
    change = paired_change(before.greedy, after.greedy)
    heldout = {"sft": before.greedy.to_dict(), "ppo": after.greedy.to_dict(), "change": asdict(change)}
    if teacher is not None:
        heldout["teacher"] = teacher.to_dict()
    if before.sampled and after.sampled:
        sampled_change = paired_change(before.sampled, after.sampled)
        heldout["sampled"] = {
            "sft": before.sampled.to_dict(),
            "ppo": after.sampled.to_dict(),
            "change": asdict(sampled_change),
        }
    summary = {
        "run": str(run),
        "seed": cfg.seed,
        "pool": len(pool.train),
        "accepted": len(pool.selection),
        "demonstrations": len(demos),
        "parameters": sum(p.numel() for p in policy.parameters()),
        "heldout": heldout,
        **({"start_check": start_check} if start_check is not None else {}),
        "timings": timings,
        "plots": [str(p) for p in plots],
    }
    (run / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    log_job(tracker, summary, losses, cfg.steps)
    console.print(result_table(before, after, teacher))
    console.print(f"  after PPO against the supervised start, greedy: {change.describe(before.greedy.tasks)}")
    if before.sampled and after.sampled:
        console.print(
            f"  sampled ({before.sampled.samples} per task; a task gains when its rate rises): "
            f"{sampled_change.describe(before.sampled.tasks)}"
        )
    console.print(family_table(before, after, {t.family for t in pool.selection}, teacher))
    console.print(f"run directory: [bold]{run}[/] (summary.json, plots/, eval/, ppo/checkpoint.pt, ppo/policy/)")
    return summary
