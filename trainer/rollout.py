"""Rollouts with TITO (token in, token out) on the model agent's episode loop: the policy drives
termgym environments through ``termgym.agents.model.ModelAgent`` with the trainer's sampler as its
client (``trainer/policy_client.py``), and the trainer later trains on exactly the ids sampled.

Every episode ends verified, so each has its reward. When the prefix cannot be kept the episode
continues in a new segment, and every segment is its own training ``Sample``
(``trainer/trajectory.py``) carrying the episode's reward.

Guarantees (tests/trainer/test_rollout.py checks them by property): each ``Sample.ids`` is the
segment's prompt, then for every turn the sampled ids unchanged, then that turn's bridge;
``loss_mask`` is 1 exactly on the sampled ids; ``logprobs`` holds the sampler's log-probability of
each sampled id (0.0 elsewhere); no text of an observation or instruction becomes a special id.
Only ``retokenize=True`` (a demonstration of what TITO avoids) re-encodes the decoded text, and
the drift then shows in ``token_drift``. With a mixture-of-experts policy each sample's ``routing``
(``[len(ids), layers, top_k]``, int16) holds the experts of the forward that first read each
sampled position; every other row is ``-1`` and routes freely in training (``trainer/routing.py``).

One episode step by step, and why segments share the reward: docs/guides/training.md#rollouts-tito."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from termgym.agents.client import ModelClient
from termgym.agents.model import AgentEnv, LoopSettings, ModelAgent
from termgym.agents.renderers import Renderer
from termgym.env import AsyncTerminalEnv, EnvOptions, SandboxFactory, prewarm_sandboxes
from termgym.integrations.harness import Harness, HarnessAgent, client_upstream
from termgym.records import TrialRecord
from termgym.sandboxes.pacing import Pacer
from termgym.scheduling.pool import Node
from termgym.scheduling.runners import TrialProgress, run_paced_trial
from termgym.tasks import Task
from termgym.transcript import Transcript
from termgym.trial import StepReturn

from .config import Config, max_context_of
from .policy_client import PolicyClient, SamplerBackend, TurnLog
from .routing import NOT_RECORDED, ROUTING_DTYPE
from .sampler import Sampler
from .trajectory import Sample, Trajectory
from .trajectory import token_drift as token_drift  # re-exported: its home before trajectory.py

# The trainer's default system prompt for the text action format: short, because a small policy's
# context is short; it says what the format's parser reads (``termgym.agents.actions.parse_text``).
SHORT_TEXT_SYSTEM = (
    "Run shell commands to do the task: one command per reply in a ```bash block. "
    "When done, reply ```bash\n:submit\n```."
)


@dataclass(frozen=True)
class RolloutSettings:
    loop: LoopSettings = field(
        default_factory=lambda: LoopSettings(action_format="text", max_tokens=32, context="none")
    )
    max_context: int = 512  # tokens per segment, prompt and observations included
    observation_tokens: int = 64  # per observation (head and tail)
    retokenize: bool = False  # demonstration only: decode and re-encode each sample (token drift)
    harness: Harness | None = None  # an agent harness behind the gateway instead of the model agent's loop


def loop_settings(cfg: Config) -> LoopSettings:
    """The model agent's settings ``cfg`` sets for every episode of a run."""
    system = cfg.system_prompt or (SHORT_TEXT_SYSTEM if cfg.action_format == "text" else None)
    return LoopSettings(
        action_format=cfg.action_format,
        max_tokens=cfg.max_new_tokens,
        max_parse_errors=cfg.max_parse_errors,
        context=cfg.context,
        system_prompt=system,
    )


def rollout_settings(cfg: Config) -> RolloutSettings:
    """The episode settings ``cfg`` sets (every rollout, evaluation and demonstration of a run)."""
    harness = None
    if cfg.agent == "mini-swe-agent":
        from termgym.integrations.mini_swe_agent import MiniSweAgent, load_config

        harness = MiniSweAgent(load_config(cfg.agent_config or None), max_turns=cfg.max_turns)
    return RolloutSettings(loop_settings(cfg), max_context_of(cfg), cfg.observation_tokens, cfg.retokenize, harness)


async def run_client_episode(
    env: AgentEnv, instruction: str, info: dict, client: ModelClient, settings: RolloutSettings, name: str
) -> StepReturn | None:
    """One episode with ``client`` as the model: the model agent's loop, or with ``settings.harness``
    the harness's own loop behind a gateway whose sessions are ``client``'s (token-exact: the
    samples are the sampler's ids, bridged while the harness's history extends them)."""
    if settings.harness is None:
        return await ModelAgent(client, settings.loop, name=name).run(env, instruction, info)
    assert isinstance(env, AsyncTerminalEnv)
    agent = HarnessAgent(settings.harness, client_upstream(client, settings.loop.max_tokens), client.model, name=name)
    try:
        return await agent.run(env, instruction, info)
    finally:
        await agent.aclose()


def rollout_options(cfg: Config, run_id: str) -> EnvOptions:
    """The environment options ``cfg`` sets, for the trials labelled ``run_id``."""
    return EnvOptions(
        backend=cfg.backend,
        cluster=cfg.cluster or None,
        max_turns=cfg.max_turns,
        command_timeout=cfg.command_timeout,
        run_id=run_id,
        reward_scale=cfg.reward_scale,
    )


def samples_of(
    transcript: Transcript, backend: SamplerBackend | None, routing_shape: tuple[int, int] | None
) -> list[Sample]:
    """The training samples of an episode's transcript: one per segment in which something was
    sampled; ``routing_shape`` (MoE layers, top_k) when the sampler recorded routing."""
    turns: list[TurnLog] = backend.turns if backend is not None else []
    samples = []
    for segment in transcript.segments:
        if not any(segment.mask):
            continue
        mine = [t for t in turns if t.segment == segment.index]
        sample = Sample(
            ids=list(segment.ids),
            loss_mask=list(segment.mask),
            logprobs=list(segment.logprobs),
            turns=[(t.start, t.start + len(t.sampled)) for t in mine],
            sampled=[list(t.sampled) for t in mine],
            segment=segment.index,
            reason=segment.reason,
        )
        if routing_shape is not None:
            layers, top_k = routing_shape
            sample.routing = torch.full((len(sample.ids), layers, top_k), NOT_RECORDED, dtype=ROUTING_DTYPE)
            for position, row in (backend.routing.get(segment.index, {}) if backend else {}).items():
                sample.routing[position] = row
        samples.append(sample)
    return samples


def fill_from_transcript(trajectory: Trajectory, transcript: Transcript) -> None:
    """The episode's outcome and counts, read from its transcript."""
    trajectory.stop_reason = transcript.stop_reason
    trajectory.commands = [t["action"]["command"] for t in transcript.turns if t["action"]["kind"] == "command"]
    trajectory.replies = sum(t.get("reply") is not None for t in transcript.turns)
    trajectory.parse_errors = transcript.parse_errors
    trajectory.bridges = sum(s.bridges for s in transcript.segments)
    trajectory.bridge_breaks = sum(s.bridge_breaks for s in transcript.segments)
    trajectory.summaries, trajectory.summaries_failed = transcript.summaries, transcript.summaries_failed
    if transcript.segments:  # the opening: the first segment's ids before the first reply
        first = transcript.segments[0]
        trajectory.prompt_tokens = first.mask.index(1) if 1 in first.mask else len(first.ids)


async def run_policy_episode(
    env: AgentEnv,
    instruction: str,
    info: dict,
    sampler: Sampler,
    renderer: Renderer,
    settings: RolloutSettings,
    generator: torch.Generator | None,
    trajectory: Trajectory,
) -> StepReturn | None:
    """Run the policy on ``env`` (already reset) through the model agent until the episode ends,
    filling ``trajectory`` (its samples, with routing when the sampler records it), whatever ends it."""
    client = PolicyClient(sampler, renderer, generator, settings.max_context, settings.observation_tokens)
    try:
        return await run_client_episode(env, instruction, info, client, settings, "policy")
    finally:
        transcript = env.transcript
        shape = sampler.routing_shape if sampler.records_routing else None
        trajectory.samples = samples_of(transcript, client.backend, shape)
        fill_from_transcript(trajectory, transcript)
        client.release(transcript)


def retokenized(trajectory: Trajectory, tokenizer) -> Trajectory:
    """The trajectory as a re-tokenizing trainer would see it: each sample's text decoded and
    encoded again, the masks kept by position. Used only to show that drift is then non-zero."""
    samples = []
    for sample in trajectory.samples:
        text = tokenizer.decode(sample.ids, skip_special_tokens=False)
        ids = tokenizer(text, add_special_tokens=False).input_ids
        n = len(ids)
        pad = max(n - len(sample.ids), 0)
        samples.append(
            replace(
                sample,
                ids=ids,
                loss_mask=(sample.loss_mask + [0] * pad)[:n],
                logprobs=(sample.logprobs + [0.0] * pad)[:n],
                routing=None,  # positions moved: nothing to replay
            )
        )
    return replace(trajectory, samples=samples)


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
    generator: torch.Generator
    trajectory: Trajectory
    name: str = "policy"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict) -> StepReturn | None:
        r = self.runner
        return await run_policy_episode(
            env, instruction, info, r.sampler, r.renderer, r.settings, self.generator, self.trajectory
        )


class PolicyRunner:
    """The scheduler's ``Runner`` of trajectories: one trial of
    ``termgym.scheduling.runners.run_paced_trial`` (the scheduler's own runner of trials) with the
    policy as the agent, every sandbox paced by the shared ``pacer``. Infrastructure faults become
    the record's error (the scheduler then counts the trial as failed), never an exception."""

    def __init__(
        self,
        sampler: Sampler,
        renderer: Renderer,
        options: EnvOptions,
        pacer: Pacer,
        settings: RolloutSettings,
        *,
        seed: int = 0,
        sandbox_factory: SandboxFactory | None = None,
        binary_reward: bool = False,
    ) -> None:
        self.sampler, self.renderer, self.options, self.pacer, self.settings = (
            sampler,
            renderer,
            options,
            pacer,
            settings,
        )
        self.seed = seed
        self.binary_reward = binary_reward  # train on resolved (0/1) instead of the dense reward
        self.sandbox_factory = sandbox_factory
        self.backend, self.agent_name, self.run_id = options.backend, "policy", options.run_id
        self._launches: dict[int, int] = {}  # per policy version

    async def run_one(self, task: Task, node: Node, version: int, progress: TrialProgress) -> Trajectory:
        # the scheduler's launch index (the order trials start in is the node pool's, not the launch order)
        launch = progress.launch if progress.launch is not None else self._launches.get(version, 0)
        self._launches[version] = max(self._launches.get(version, 0), launch) + 1
        generator = torch.Generator().manual_seed(episode_seed(self.seed, version, launch))
        trajectory = Trajectory(task=task.name, policy_version=version, launch=launch)
        agent = _PolicyAgent(self, generator, trajectory)
        record = await run_paced_trial(
            task, agent, self.options, self.pacer, progress, sandbox_factory=self.sandbox_factory
        )
        trajectory.record = record
        trajectory.reward = float(record.resolved) if self.binary_reward else record.reward
        if self.settings.retokenize:
            trajectory = retokenized(trajectory, self.renderer.tokenizer)
        return trajectory

    def record_of(self, result: Trajectory) -> TrialRecord:
        assert result.record is not None
        return result.record

    @staticmethod
    def work_of(result: Trajectory) -> float:
        """The episode's work on the scheduler's ``work`` clock: one unit per token the policy
        sampled (a forward each, the bulk of an episode's time here) and per command it ran."""
        sampled = sum(sum(sample.loss_mask) for sample in result.samples)
        return float(sampled + len(result.commands))

    async def prewarm(self, tasks: Sequence[Task]) -> int:
        """Sandboxes for episodes of ``tasks`` made ready ahead of them (``prewarm_sandboxes``)."""
        return await prewarm_sandboxes(tasks, self.options)


def append_trajectories(path: Path, trajectories: Sequence[Trajectory], step: int) -> None:
    """Append one JSON line per trajectory (with its step) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as handle:
        handle.writelines(
            json.dumps({"step": step, **json.loads(trajectory.to_json())}) + "\n" for trajectory in trajectories
        )
