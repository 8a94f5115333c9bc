"""The trainer's configuration: ``Config``, every setting of a run, built from one dataclass per
concern (the run, the policy, tasks and sandboxes, a step's batch, episodes, the generator, reward,
PPO, the supervised start, held-out evaluation), and the values derived from it.

Every field has a docstring right under it, and each group's docstring is its title: the command
line (``trainer/flags.py``) makes every field a flag of the same name, under its group's title,
with its docstring as the help. A run reads its fields flat (``cfg.clip``), whichever group holds
them; code that needs one concern alone can take that group's type. A mode is a ``Literal``:
``--help`` lists its values and ``check_config`` (``trainer/checks.py``) refuses any other.
``PRESETS`` are named sets of values (``--preset NAME``; flags given explicitly win).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from termgym.agents.actions import ActionFormat
from termgym.agents.model import ContextPolicy
from termgym.agents.renderers.base import ThinkingRetention
from termgym.scheduling.scheduler import SchedulerMode

# The trainer's own modes (the others are the model agent's and the scheduler's, imported above).
GeneratorName = Literal["torch", "vllm", "server"]
SamplerDtype = Literal["float32", "bfloat16"]
Advantage = Literal["gae", "group"]
RewardKind = Literal["dense", "binary"]
DemonstrationSource = Literal["reference", "teacher"]
SftDataTokens = Literal["auto", "ids", "render"]  # termgym.trainer.sft_data.TOKEN_USES
RendererName = Literal["auto", "chatml", "qwen-xml", "llama3", "template"]  # termgym.agents.renderers.RENDERER_NAMES
AgentName = Literal["model", "mini-swe-agent"]  # who drives an episode (termgym.agents.settings.AGENTS' trainable ones)
FamilySetName = Literal["short", "long", "explore", "parts"]  # the keys of termgym.envs.families.FAMILY_SETS
TrackerName = Literal["", "tensorboard", "wandb"]  # termgym.tracking.TRACKERS, or none

DEFAULT_MAX_CONTEXT = 1024  # tokens per segment: the tiny policy's, and a model's whose config states none


@dataclass
class RunSettings:
    """the run"""

    out: str = ""
    """run directory: metrics.jsonl, trajectories.jsonl, records.jsonl, checkpoint.pt, policy/ (with --pool: every
    phase's output, see trainer/pipeline.py); empty: runs/train-<UTC time>, or runs/pipeline-<UTC time> with --pool"""
    seed: int = 0
    """seeds the tiny policy, the task order, sampling and minibatch order"""
    steps: int = 10
    """training steps (each: one batch of rollouts, then one update)"""
    checkpoint_every: int = 1
    """steps between checkpoints (and at the end)"""
    resume: bool = False
    """continue from OUT/checkpoint.pt if it exists"""
    fsdp: bool = False
    """under torchrun: shard policy and critic with FSDP2 (fully_shard) instead of replicating them"""
    track: TrackerName = ""
    """also send the metrics to tensorboard (event files in OUT/tensorboard) or wandb (a W&B run in OUT/wandb, offline
    unless WANDB_MODE says otherwise): every step's metrics, the held-out table per family at the end (with --pool), the
    configuration as the run's hyperparameters; the track extra. "": metrics.jsonl alone"""


@dataclass
class PolicySettings:
    """the policy (without --model, a tiny one is built)"""

    model: str = ""
    """policy directory (any causal LM with its tokenizer, loaded locally); empty: build the tiny Qwen3-MoE policy into
    OUT/init"""
    renderer: RendererName = "auto"
    """the policy's chat format: auto (decided from the model directory's files), chatml (Qwen2.5/Qwen3), qwen-xml
    (Qwen3.5, Qwen3-Coder), llama3, or template (the tokenizer's own chat template, its prefix checked every turn)"""
    thinking: ThinkingRetention = "cycle"
    """earlier reasoning kept in the prompt: all, cycle (within the tool cycle, Qwen3's rule) or strip (every reply with
    reasoning then starts a new segment)"""
    hidden: int = 64
    """tiny policy: hidden size (when no --model is given)"""
    layers: int = 2
    """tiny policy: decoder layers, every one a sparse MoE block"""
    experts: int = 4
    """tiny policy: experts per layer (top-2 routing)"""


@dataclass
class TaskSettings:
    """tasks and sandboxes (--pool: a generated, audited pool)"""

    tasks: tuple[str, ...] = ()
    """task directories or bundled task names; empty: every bundled task"""
    backend: str = "local"
    """sandbox backend (local = the embedded one)"""
    cluster: str = ""
    """run the sandboxes on the nodes of a Ray cluster: ray://HOST:PORT, HOST:PORT, or ray (RAY_ADDRESS, else the
    cluster started on this machine); the ray extra. Each node is one of the scheduler's nodes, with its CPUs /
    --cpus-per-sandbox at once. "": this machine"""
    cpus_per_sandbox: float = 1.0
    """with --cluster: the CPUs one sandbox takes on its node"""
    pool: int = 0
    """generate a training pool of this many tasks (envs/families) and a held-out set, audit the pool and train on the
    accepted tasks: supervised warm start, held-out evaluation, critic warm-up and PPO, evaluation again, plots and a
    final table. 0: PPO alone on --tasks"""
    families: FamilySetName = "short"
    """with --pool: the family set the pool and the held-out set are drawn from (envs/families): short (1 to 3 turns, 3
    to 6 assertions a task), long (4 to 8 turns, 8 to 20 assertions; for the recipe's comparisons, bench/recipe.py),
    explore (the main job's: 1 or 2 turns, each family with the scripted teacher's systematic mistake, two that must
    look before acting; envs/families/explore) or parts (3 to 5 independent parts, one assertion each, the teacher
    mistaken on each independently: where dense and binary reward differ; bench/dense_binary.py)"""
    audit_k: int = 1
    """oracle runs per task when auditing the pool (flaky: rejected)"""
    audit_cache: str = ""
    """earlier verdicts by task content (termgym audit --cache FILE): tasks whose files are unchanged are not audited
    again; the run writes the complete cache to OUT/audit-cache.json. "bundled": the cache shipped for the families
    (envs/families/audit-cache.json)"""


@dataclass
class BatchSettings:
    """a step's batch (the scheduler)"""

    batch_size: int = 8
    """trajectories kept per step (the global batch)"""
    launch: int | None = None
    """trials launched per step (cancel, carry-over, reweight modes); default batch x 560/512"""
    mode: SchedulerMode = "wait"
    """scheduler mode: wait, cancel, carry-over or reweight"""
    deterministic: bool = True
    """the same seed gives the same run on one machine (metrics, checkpoints, held-out results): the scheduler keeps the
    first B trials by simulated work (tokens sampled and commands run, in launch order on --concurrency slots), not by
    wall clock, and the torch sampler gives each request a forward of its own (a batched forward rounds differently with
    its batch, which timing decides). --no-deterministic: the wall clock and batched forwards, faster, for production
    runs (docs/guides/training.md#determinism)"""
    concurrency: int = 8
    """trials in flight at once (one rollout node with this cap)"""
    group_size: int = 1
    """episodes launched per task in a step (one task drawn, launched this many times); the group advantage needs at
    least 2"""


@dataclass
class EpisodeSettings:
    """episodes (the model agent's loop)"""

    agent: AgentName = "model"
    """who drives each episode (rollouts, evaluation, demonstrations): model (termgym's model agent loop) or
    mini-swe-agent (the unchanged mini-swe-agent harness, its model calls through the recording gateway to the policy;
    needs the harnesses extra and --action-format tool)"""
    agent_config: str = ""
    """with --agent mini-swe-agent: its configuration (a YAML path, or a name in termgym/integrations/configs: tiny,
    short prompts for a small context); empty: mini-swe-agent's own mini.yaml"""
    max_turns: int = 4
    """commands per episode before the environment truncates it"""
    command_timeout: float = 10.0
    """seconds per command"""
    max_new_tokens: int = 48
    """tokens the policy may sample per turn"""
    max_context: int | None = None
    """tokens per episode, prompt and observations included; beyond it the episode is truncated. Default: with --model,
    the model's own context window (its config.json's max_position_embeddings or the like; 1024 when it states none);
    else 1024, the tiny policy's"""
    observation_tokens: int = 128
    """tokens kept of each observation (head and tail)"""
    action_format: ActionFormat = "tool"
    """how a reply asks for a command: tool (a bash tool call in the renderer's format) or text (one fenced ```bash
    block)"""
    system_prompt: str = ""
    """the agent's system prompt; empty: the action format's own (a one-line prompt for the text format)"""
    context: ContextPolicy = "none"
    """when a segment's context fills up: none (the episode ends, context_exhausted), truncate (elide old observations:
    a new segment) or summarize (the policy summarizes: a new segment)"""
    max_parse_errors: int = 3
    """replies in a row that do not parse before the episode ends"""
    retokenize: bool = False
    """demonstration only: train on re-tokenized text instead of the sampled ids (token drift > 0)"""


@dataclass
class GeneratorSettings:
    """the generator (what samples the rollouts)"""

    generator: GeneratorName = "torch"
    """rollout engine: torch (the policy's own batched forward; records MoE routing), vllm (a vLLM engine in its own
    processes, weights published into it each step and checked against the trainer's log-probs; needs head_dim >= 64; on
    CPU it cannot return routed experts, so R3 is off for that run) or server (a running vllm serve at --base-url,
    weights published to it each step; see docs/guides/training.md)"""
    base_url: str = ""
    """with --generator server: the server's OpenAI-compatible URL, e.g. http://127.0.0.1:8000/v1"""
    served_model: str = ""
    """with --generator server: the model's name on the server (its --served-model-name)"""
    sampler_dtype: SamplerDtype = "float32"
    """torch generator's precision: float32 (the trainer's) or bfloat16, a sampler that differs numerically from the
    trainer as production samplers do (what R3 is for)"""


@dataclass
class RewardSettings:
    """reward"""

    reward: RewardKind = "dense"
    """what PPO optimises: dense (min(assertions passed, S) / S, the verifier's reward) or binary (1 if resolved, else
    0)"""
    reward_scale: int = 20
    """the dense reward's assertion scale S (termgym's --reward-scale): each passed assertion is worth 1/S, up to S of
    them"""


@dataclass
class PPOSettings:
    """PPO"""

    advantage: Advantage = "gae"
    """gae: GAE over the critic's token values (the recipe); group: no critic, each episode's reward minus the mean of
    the other episodes of its task in the batch (RLOO), the same for all its tokens; launch several episodes per task
    with --group-size"""
    gamma: float = 1.0
    """discount over action tokens"""
    lam: float = 1.0
    """GAE lambda"""
    clip: float = 0.2
    """PPO ratio clip (symmetric)"""
    value_clip: float = 0.5
    """value-loss clip around the rollout-time values"""
    actor_lr: float = 1e-6
    """policy learning rate (Adam)"""
    critic_lr: float = 1.5e-5
    """critic learning rate (Adam)"""
    kl_coef: float = 0.0
    """weight of a KL penalty to the starting policy (the model as loaded, before any update; per action token, added to
    the policy loss). It anchors what the reward barely constrains; 0: no reference model is kept"""
    max_grad_norm: float = 1.0
    """gradient clipping, per model"""
    update_epochs: int = 2
    """passes over each batch"""
    minibatch_size: int = 4
    """trajectories per minibatch"""
    critic_warmup_steps: int = 2
    """steps of critic-only updates on rollouts of the starting policy before the first policy update"""
    routing_replay: bool = True
    """R3 for MoE policies: the log-prob recompute and the loss forwards use the experts the sampler chose at sampled
    tokens (prompt and observation tokens route freely); turns the router load-balancing loss off. No effect on a dense
    policy"""


@dataclass
class SupervisedSettings:
    """supervised start (with --pool)"""

    sft_steps: int = 0
    """supervised warm-start steps on the reference trajectories of the audited pool (with --pool)"""
    init: str = ""
    """with --pool: the model directory the policy starts from (its tokenizer included) instead of a freshly built tiny
    one; "bundled": the tiny base shipped in trainer/tiny_base (scripts/build_tiny_base.py: the tiny architecture after
    750 supervised steps on the short families' reference solutions, seed 0; it copies names from an instruction as a
    pretrained model does, and has seen no explore family and no held-out name)"""
    ppo_pool: int = 0
    """with --pool: this many accepted tasks, spread evenly over the audit's order, are kept for PPO: the supervised
    start never sees them, so PPO's tasks are as new to the policy as the held-out set's names (a policy that memorised
    its demonstrations would sample nothing else on them); 0: PPO draws from every accepted task"""
    demonstrations: DemonstrationSource = "reference"
    """with --pool: what the supervised start imitates: reference (the reference solutions; only resolved episodes) or
    teacher (the scripted teacher of envs/families/teacher.py: the reference with each family's systematic mistakes at
    their stated rates, every episode kept, as a real model's distilled trajectories are; its held-out resolved rate is
    measured and printed beside the policy's)"""
    sft_data: str = ""
    """with --pool: ATIF trajectory files or directories of them (comma-separated; termgym export atif's, or any
    harness's) that the supervised start trains on instead of recording demonstrations: each trajectory's token ids
    where they are the policy's (--sft-data-tokens), else its messages rendered with the policy's renderer; agent steps
    that do not fit (beyond --max-context, no text to render, excluded by the RFC) are counted and reported, in
    run/sft/sft-data.json (docs/guides/atif.md)"""
    sft_data_tokens: SftDataTokens = "auto"
    """with --sft-data: auto (a trajectory's token ids when its tokenizer fingerprint is the policy's, else its messages
    rendered), ids (the token ids wherever present: you vouch that the tokenizer is the policy's) or render (always the
    messages)"""
    sft_batch_size: int = 32
    """demonstrations per supervised step"""
    sft_lr: float = 3e-3
    """supervised learning rate (AdamW, linear warm-up over the first tenth)"""
    sft_stop_share: float = 0.0
    """with --pool: stop the supervised steps on the pool's trajectories at the first check (every --sft-check-every
    steps, at most --sft-steps) at which the policy, greedy, passes at least this share of the assertions of a
    validation split (--sft-validation tasks of the training name space, none of them in the pool); 0: take every step.
    The tiny-long preset stops at 0.3, the recipe's condition for its start, where a fixed step count lands seeds from
    12% to 60%"""
    start_floor: float = 0.0
    """with --pool: after the supervised start, a greedy evaluation on a validation split (--sft-validation tasks of the
    training name space, none of them in the pool); below this share of its assertions the job says so in a line and in
    summary.json's start_check, and goes on. 0: no check. The tiny preset's floor is 0.2 (its starts passed 28% to 33%
    of the held-out assertions on seeds 0 to 2)"""
    sft_check_every: int = 20
    """with --sft-stop-share: supervised steps between two validation checks"""
    sft_validation: int = 40
    """with --sft-stop-share: tasks in the validation split"""
    sft_first_families: FamilySetName | Literal[""] = ""
    """with --pool: a family set the supervised start learns first (--sft-first-steps on the reference trajectories of
    its own audited pool of --sft-first-pool training tasks), before --sft-steps on the pool's; empty: none. The
    tiny-long preset learns the short set first: the copying is learnt there in a third of the time a long step takes"""
    sft_first_pool: int = 0
    """with --sft-first-families: its pool's size"""
    sft_first_steps: int = 0
    """with --sft-first-families: supervised steps on its reference trajectories"""


@dataclass
class EvaluationSettings:
    """held-out evaluation (with --pool)"""

    heldout: int = 48
    """held-out evaluation tasks generated with the pool (names never used in training, and one family never trained on)
    """
    eval_samples: int = 0
    """with --pool: besides the greedy evaluation, this many episodes per held-out task sampled at temperature 1 (the
    distribution PPO trains; the same draws before and after); 0: greedy only"""


# dataclasses collect the fields of the last base first: the groups are listed from the last to the
# first, so that the fields (and --help) run in GROUPS' order, the run's first
@dataclass
class Config(
    EvaluationSettings,
    SupervisedSettings,
    PPOSettings,
    RewardSettings,
    GeneratorSettings,
    EpisodeSettings,
    BatchSettings,
    TaskSettings,
    PolicySettings,
    RunSettings,
):
    """Every setting of a run: the fields of every group, read flat (``cfg.clip``)."""


GROUPS: tuple[type, ...] = (
    RunSettings,
    PolicySettings,
    TaskSettings,
    BatchSettings,
    EpisodeSettings,
    GeneratorSettings,
    RewardSettings,
    PPOSettings,
    SupervisedSettings,
    EvaluationSettings,
)


# The main job on a 2-core CPU (make demo): the explore families, whose scripted teacher makes a
# systematic mistake in each (envs/families/explore); a generated, audited pool, 300 of its tasks
# kept for PPO; a supervised start from the shipped tiny base (scripts/build_tiny_base.py) on the
# teacher's demonstrations, mistakes included; PPO with the dense reward in the bias-correcting
# scheduler mode, anchored to the supervised start by a KL penalty; held-out evaluation before and
# after, the teacher's beside them. docs/results/main-job.md has the measured runs.
TINY: dict = dict(
    pool=1200,
    heldout=192,
    families="explore",
    audit_k=1,
    audit_cache="bundled",
    init="bundled",
    demonstrations="teacher",
    ppo_pool=300,
    sft_steps=200,
    start_floor=0.2,
    sft_batch_size=32,
    sft_lr=3e-3,
    hidden=128,
    layers=3,
    experts=8,
    steps=24,
    batch_size=32,
    concurrency=8,
    mode="reweight",
    max_turns=4,
    command_timeout=5.0,
    max_new_tokens=48,
    max_context=512,
    observation_tokens=64,
    action_format="text",
    actor_lr=2e-4,
    critic_lr=1e-3,
    kl_coef=0.5,
    update_epochs=2,
    minibatch_size=8,
    critic_warmup_steps=2,
)

PRESETS: dict[str, dict] = {
    "tiny": TINY,
    # The recipe's comparisons (bench/recipe.py): the tiny policy on the long family set, where a
    # supervised start resolves few tasks in full but passes many of their assertions: it learns
    # the short set first, then the long pool until a validation split's share reaches 30%.
    "tiny-long": {
        **TINY,
        "families": "long",
        "init": "",  # built fresh, with the short set's references first
        "demonstrations": "reference",
        "ppo_pool": 0,
        "start_floor": 0.0,
        "steps": 10,
        "pool": 600,
        "heldout": 100,
        "sft_steps": 300,
        "sft_stop_share": 0.3,
        "sft_check_every": 20,
        "sft_validation": 40,
        "sft_first_families": "short",
        "sft_first_pool": 1200,
        "sft_first_steps": 450,
        "max_turns": 9,
        "max_new_tokens": 64,
        "max_context": 768,
    },
    # PPO alone, for a quick look at the loop: a tiny MoE policy, four quick bundled tasks, short
    # episodes, larger learning rates than the published ones (which are for billion-parameter models).
    "tiny-ppo": dict(
        tasks=(
            "text-processing/word-frequency",
            "file-ops/organize-by-extension",
            "shell-scripting/ipv4-filter",
            "archives/extract-configs",
        ),
        steps=4,
        batch_size=4,
        concurrency=4,
        max_turns=2,
        command_timeout=5.0,
        max_new_tokens=24,
        observation_tokens=64,
        action_format="text",
        actor_lr=1e-4,
        critic_lr=1e-3,
        update_epochs=2,
        minibatch_size=2,
        critic_warmup_steps=1,
    ),
}


def warmup_steps(cfg: Config) -> int:
    """Steps of critic-only updates before the first policy update: none without a critic."""
    return cfg.critic_warmup_steps if cfg.advantage == "gae" else 0


def resolve_max_context(cfg: Config, window: int | None) -> Config:
    """``cfg`` with ``max_context`` filled in when it was not given (by a flag, a preset or code):
    ``window``, the model's own context window (with --model), else ``DEFAULT_MAX_CONTEXT``. Pure."""
    if cfg.max_context is not None:
        return cfg
    return replace(cfg, max_context=window or DEFAULT_MAX_CONTEXT)


def max_context_of(cfg: Config) -> int:
    """Tokens per segment under ``cfg``: as given or resolved, else ``DEFAULT_MAX_CONTEXT``."""
    return DEFAULT_MAX_CONTEXT if cfg.max_context is None else cfg.max_context


TINY_BASE = Path(__file__).resolve().parent / "tiny_base"  # --init bundled (scripts/build_tiny_base.py)


def init_dir(cfg: Config) -> Path:
    """The model directory ``--init`` names (``bundled``: the shipped tiny base)."""
    return TINY_BASE if cfg.init == "bundled" else Path(cfg.init)
