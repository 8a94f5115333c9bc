"""Rollouts with TITO (token in, token out): the policy drives termgym environments, and the trainer
later trains on exactly the token ids the sampler produced.

One episode: a chat prompt (system text, then the task's instruction) is tokenized once; the policy
samples a command token by token until its end-of-turn token (``<|im_end|>``) or its submit marker
(``<|submit|>``); the command (the sampled ids decoded, special tokens dropped) goes to
``env.step``; the observation is tokenized on its own, framed as a user turn, and appended. The
episode ends when the policy submits, the environment's turn budget runs out, or the next tokens
would not fit in the context (``truncated``; the environment is then submitted, so the verifier
still grades it). A prompt longer than the context is kept whole and nothing is sampled.

Guarantees (tests/trainer/test_rollout.py checks them by property): ``Trajectory.ids`` is the prompt,
then for every turn the sampled ids unchanged, then that turn's observation ids; ``loss_mask`` is 1
exactly on the sampled ids; ``logprobs`` holds the sampler's log-probability of each sampled id (0.0
elsewhere); text in observations and instructions can never produce a special token. Only
``retokenize=True`` (a demonstration of what TITO avoids) re-encodes the decoded text, and the
drift then shows up in ``token_drift``.

Each turn is one ``generate_turn`` request to the sampler (the ``Sampler`` protocol,
``trainer/sampler.py``): up to ``max_new_tokens``, within the context, ending at a stop id. The
torch sampler batches across the episodes in flight (one forward pass serves every next-token
request queued before the event loop gets to it, over only the tokens each request appended since
its episode's last forward); the vLLM sampler (``trainer/vllm_sampler.py``) serves whole turns.

Routing (R3, ``trainer/routing.py``): with a mixture-of-experts policy the sampler also records, in
``Trajectory.routing`` (``[len(ids), layers, top_k]``, int16), the top-k expert ids of every MoE
layer at each *sampled* position ``p``, taken from the sampler forward that consumed ``ids[p]`` as
input (the first forward whose input reached position ``p``: the one that sampled ``p + 1``, or for
a turn's last token the next turn's first forward). That is the routing every later token's
log-prob depended on. All other rows are ``-1``: prompt and observation positions, and the
episode's last sampled token, which no forward consumed; in the training forward they take that
forward's own routing.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol

import torch

from termgym.env import SUBMIT, AsyncTerminalEnv, EnvOptions
from termgym.env import default_sandbox_factory as backend_sandbox_factory
from termgym.records import TrialRecord
from termgym.sandboxes.base import Sandbox
from termgym.sandboxes.pacing import Pacer
from termgym.scheduling.scheduler import Node, PacedSandbox, TrialProgress
from termgym.tasks import Task
from termgym.trainer.chat import ChatFormat
from termgym.trainer.config import Config
from termgym.trainer.routing import NOT_RECORDED, ROUTING_DTYPE
from termgym.trainer.sampler import Sampler
from termgym.trial import Step, run_trial


class EpisodeEnv(Protocol):
    """What ``drive_episode`` uses of an environment: ``AsyncTerminalEnv``, or a scripted stand-in."""

    @property
    def done(self) -> bool: ...

    async def step(self, action: str) -> Step: ...


@dataclass(frozen=True)
class RolloutSettings:
    max_new_tokens: int = 32  # per turn
    max_context: int = 512  # tokens in the whole episode
    observation_tokens: int = 64  # per observation
    retokenize: bool = False  # demonstration only: decode and re-encode the episode (token drift)


def rollout_settings(cfg: Config) -> RolloutSettings:
    """The episode limits ``cfg`` sets (every rollout and evaluation of a run uses the same)."""
    return RolloutSettings(cfg.max_new_tokens, cfg.max_context, cfg.observation_tokens, cfg.retokenize)


def rollout_options(cfg: Config, run_id: str) -> EnvOptions:
    """The environment options ``cfg`` sets, for the trials labelled ``run_id``."""
    return EnvOptions(backend=cfg.backend, max_turns=cfg.max_turns, command_timeout=cfg.command_timeout, run_id=run_id)


@dataclass
class Trajectory:
    """One episode as the trainer consumes it. Per-token lists are aligned with ``ids``."""

    task: str
    ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)  # [start, end) of each turn's sampled ids
    sampled: list[list[int]] = field(default_factory=list)  # each turn's ids as the sampler returned them
    commands: list[str] = field(default_factory=list)
    policy_version: int = 0
    launch: int = 0  # launch order within the step (a deterministic batch order)
    truncated: bool = False  # ran out of context
    reward: float = 0.0
    record: TrialRecord | None = None
    routing: torch.Tensor | None = None  # [len(ids), MoE layers, top_k] int16, -1 where not recorded (module docstring)

    def to_json(self) -> str:
        """One JSON object; ``routing`` is null, or one entry per id: null where not recorded, else
        ``[layers][top_k]`` expert ids."""
        fields = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "routing"}
        out = asdict(Trajectory(**fields))  # routing None
        if self.routing is not None:
            recorded = (self.routing >= 0).flatten(1).all(1).tolist()
            out["routing"] = [row if kept else None for row, kept in zip(self.routing.tolist(), recorded)]
        return json.dumps(out)


def token_drift(trajectory: Trajectory) -> int:
    """Positions of the loss region whose training id differs from the id the sampler returned
    (a position past the end of ``ids`` counts as different). Exactly 0 under TITO."""
    drift = 0
    for (start, _), sampled in zip(trajectory.turns, trajectory.sampled):
        for offset, token in enumerate(sampled):
            position = start + offset
            drift += position >= len(trajectory.ids) or trajectory.ids[position] != token
    return drift


async def drive_episode(
    env: EpisodeEnv,
    instruction: str,
    sampler: Sampler,
    chat: ChatFormat,
    settings: RolloutSettings,
    generator: torch.Generator | None,
    trajectory: Trajectory,
) -> Step | None:
    """Run the policy on ``env`` (already reset) until the episode ends, filling ``trajectory``
    (and ``trajectory.routing`` when the sampler records routing)."""
    routed: dict[int, torch.Tensor] | None = {} if sampler.records_routing else None
    try:
        return await _drive(env, instruction, sampler, chat, settings, generator, trajectory, routed)
    finally:
        sampler.forget(trajectory.ids)
        if routed is not None:
            layers, top_k = sampler.routing_shape
            trajectory.routing = torch.full((len(trajectory.ids), layers, top_k), NOT_RECORDED, dtype=ROUTING_DTYPE)
            for position, row in routed.items():
                trajectory.routing[position] = row


async def _drive(
    env: EpisodeEnv,
    instruction: str,
    sampler: Sampler,
    chat: ChatFormat,
    settings: RolloutSettings,
    generator: torch.Generator | None,
    trajectory: Trajectory,
    routed: dict | None,
) -> Step | None:
    unconsumed: list[int] = []  # sampled positions no sampler forward has read yet
    prompt = chat.prompt(instruction)
    trajectory.ids, trajectory.loss_mask, trajectory.logprobs = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
    step: Step | None = None
    while not env.done:
        start = len(trajectory.ids)
        budget = min(settings.max_new_tokens, settings.max_context - start)
        sampled: list[int] = []
        if budget >= 1:
            positions = list(unconsumed) if routed is not None else []
            turn = await sampler.generate_turn(trajectory.ids, budget, chat.stop_ids, generator, positions)
            sampled = list(turn.tokens)
            if routed is not None and sampled:  # the unconsumed positions and all sampled ids but the last are now read
                routed.update(turn.routing or {})
                unconsumed[:] = [start + len(sampled) - 1]
            trajectory.ids += sampled
            trajectory.loss_mask += [1] * len(sampled)
            trajectory.logprobs += turn.logprobs
        trajectory.turns.append((start, len(trajectory.ids)))
        trajectory.sampled.append(sampled)
        command = chat.command(sampled)
        trajectory.commands.append(command)
        if chat.submit in sampled:
            return await env.step(SUBMIT)
        if len(trajectory.ids) >= settings.max_context:
            trajectory.truncated = True
            return await env.step(SUBMIT)
        step = await env.step(command)
        if env.done:
            return step
        observation = chat.observation(step[0], settings.observation_tokens, closed=chat.im_end in sampled)
        if len(trajectory.ids) + len(observation) + 1 > settings.max_context:
            trajectory.truncated = True
            return await env.step(SUBMIT)
        trajectory.ids += observation
        trajectory.loss_mask += [0] * len(observation)
        trajectory.logprobs += [0.0] * len(observation)
    return step


def retokenized(trajectory: Trajectory, tokenizer) -> Trajectory:
    """The trajectory as a re-tokenizing trainer would see it: the text decoded and encoded again,
    the masks kept by position. Used only to show that drift is then non-zero."""
    text = tokenizer.decode(trajectory.ids, skip_special_tokens=False)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    n = len(ids)
    pad = max(n - len(trajectory.ids), 0)
    return Trajectory(
        **{
            **{k: getattr(trajectory, k) for k in trajectory.__dataclass_fields__},
            "ids": ids,
            "loss_mask": (trajectory.loss_mask + [0] * pad)[:n],
            "logprobs": (trajectory.logprobs + [0.0] * pad)[:n],
            "routing": None,  # positions moved: nothing to replay
        }
    )


def stream_seed(*parts: object) -> int:
    """A 63-bit seed determined by ``parts`` alone (a hash of their ``/``-joined text)."""
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def episode_seed(seed: int, version: int, launch: int) -> int:
    """A sampling seed per (run seed, policy version, launch index): episodes do not share a random
    stream, so how requests happen to be batched cannot change what is sampled."""
    return stream_seed(seed, version, launch)


# -- the scheduler's Runner ------------------------------------------------------------------------


@dataclass
class _PolicyAgent:
    """termgym's ``Agent`` protocol around the policy, for one trial."""

    runner: PolicyRunner
    progress: TrialProgress
    generator: torch.Generator
    trajectory: Trajectory
    name: str = "policy"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> Step | None:
        self.progress.env = env
        r = self.runner
        return await drive_episode(env, instruction, r.sampler, r.chat, r.settings, self.generator, self.trajectory)


class PolicyRunner:
    """The scheduler's ``Runner`` of trajectories: one trial of ``termgym.trial.run_trial`` with the
    policy as the agent, every sandbox paced by the shared ``pacer``. Infrastructure faults become
    the record's error (the scheduler then counts the trial as failed), never an exception."""

    def __init__(
        self,
        sampler: Sampler,
        chat: ChatFormat,
        options: EnvOptions,
        pacer: Pacer,
        settings: RolloutSettings,
        *,
        seed: int = 0,
        sandbox_factory: Callable[[Task, EnvOptions], Sandbox] | None = None,
        binary_reward: bool = False,
    ) -> None:
        self.sampler, self.chat, self.options, self.pacer, self.settings = sampler, chat, options, pacer, settings
        self.seed = seed
        self.binary_reward = binary_reward  # train on resolved (0/1) instead of the dense reward
        self.sandbox_factory = sandbox_factory or backend_sandbox_factory
        self.backend, self.agent_name, self.run_id = options.backend, "policy", options.run_id
        self._launches: dict[int, int] = {}  # per policy version

    async def run_one(self, task: Task, node: Node, version: int, progress: TrialProgress) -> Trajectory:
        launch = self._launches.get(version, 0)
        self._launches[version] = launch + 1
        generator = torch.Generator().manual_seed(episode_seed(self.seed, version, launch))
        trajectory = Trajectory(task=task.name, policy_version=version, launch=launch)
        agent = _PolicyAgent(self, progress, generator, trajectory)

        def paced(task: Task, options: EnvOptions):
            return PacedSandbox(self.sandbox_factory(task, options), self.pacer, progress)

        record = await run_trial(task, agent, self.options, sandbox_factory=paced)
        trajectory.record = record
        trajectory.reward = float(record.resolved) if self.binary_reward else record.reward
        if self.settings.retokenize:
            trajectory = retokenized(trajectory, self.chat.tokenizer)
        return trajectory

    def record_of(self, result: Trajectory) -> TrialRecord:
        assert result.record is not None
        return result.record


def append_trajectories(path: Path, trajectories: Sequence[Trajectory], step: int) -> None:
    """Append one JSON line per trajectory (with its step) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.writelines(
            json.dumps({"step": step, **json.loads(trajectory.to_json())}) + "\n" for trajectory in trajectories
        )
