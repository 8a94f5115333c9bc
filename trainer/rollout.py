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

Generation is batched across the episodes in flight: ``BatchedSampler.sample`` queues a request and
one forward pass serves every request queued before the event loop gets to it, over only the
tokens each request appended since its episode's last forward (the key/value cache,
``trainer/kv_cache.py``; ``kv_cache=False`` recomputes every position). A sampler with a
``generate_turn`` method (the vLLM generator, ``trainer/vllm_generator.py``) is asked for a whole
turn at a time instead (up to ``max_new_tokens``, within the context, ending at a stop id); the
guarantees above hold the same way.

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

import asyncio
import hashlib
import json
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from termgym.env import SUBMIT, AsyncTerminalEnv, EnvOptions
from termgym.env import default_sandbox_factory as backend_sandbox_factory
from termgym.pacing import Pacer
from termgym.records import TrialRecord
from termgym.scheduler import Node, PacedSandbox, TrialProgress
from termgym.tasks import Task
from termgym.trial import Step, run_trial
from trainer import ppo
from trainer.config import Config
from trainer.kv_cache import PrefixCache, cached_next_token_logprobs
from trainer.models import IM_END, IM_START, SUBMIT_TOKEN
from trainer.routing import NOT_RECORDED, ROUTING_DTYPE, is_moe, record_routing, routing_shape, stack_routing

SYSTEM_PROMPT = (
    "You operate a Linux shell to complete the user's task. Reply with exactly one shell command per "
    "turn; you will see its output. When the task is done, reply with <|submit|>."
)


# -- chat framing ----------------------------------------------------------------------------------


class ChatFormat:
    """Token ids of the chat framing. Text is encoded with special tokens split, so no text, however
    hostile, turns into ``<|im_end|>`` or ``<|submit|>``."""

    def __init__(self, tokenizer, system: str = SYSTEM_PROMPT) -> None:
        self.tokenizer = tokenizer
        self.im_start, self.im_end = tokenizer.convert_tokens_to_ids(IM_START), tokenizer.convert_tokens_to_ids(IM_END)
        self.submit = tokenizer.convert_tokens_to_ids(SUBMIT_TOKEN)
        self.stop_ids = (self.im_end, self.submit)
        self.system = system

    def text(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids if text else []

    def prompt(self, instruction: str) -> list[int]:
        """System turn, user turn with the instruction, then the assistant header."""
        return (
            [self.im_start] + self.text(f"system\n{self.system}") + [self.im_end] + self.text("\n")
            + [self.im_start] + self.text(f"user\n{instruction}") + [self.im_end] + self.text("\n")
            + [self.im_start] + self.text("assistant\n")
        )  # fmt: skip

    def observation(self, observation: str, max_tokens: int, *, closed: bool = True) -> list[int]:
        """A user turn holding the observation (its first ``max_tokens`` tokens), then the next
        assistant header. It starts with ``<|im_end|>`` when the sampled turn was not ``closed``
        (it ran out of tokens before its end-of-turn token)."""
        body = self.text(observation)[:max_tokens]
        return (
            ([] if closed else [self.im_end]) + self.text("\n") + [self.im_start] + self.text("user\n") + body + [self.im_end] + self.text("\n")
            + [self.im_start] + self.text("assistant\n")
        )  # fmt: skip

    def command(self, sampled: Sequence[int]) -> str:
        """The shell command a turn's sampled ids spell (special tokens dropped)."""
        return self.tokenizer.decode([t for t in sampled if t not in self.stop_ids], skip_special_tokens=True)


# -- padding ----------------------------------------------------------------------------------------


def pad_ids(sequences: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ``ids`` and their ``attention`` mask (1 on real tokens)."""
    width = max(len(seq) for seq in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[row, : len(seq)] = 1
    return ids, attention


def pad_batch(rows: Sequence[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``ids``, ``attention`` and the loss mask aligned with ``ids[:, 1:]``, for
    ``(ids, loss_mask)`` rows (the trainer's batches and the supervised warm start's)."""
    ids, attention = pad_ids([seq for seq, _ in rows], pad_id)
    mask = torch.zeros(ids.shape)
    for row, (_, loss_mask) in enumerate(rows):
        mask[row, : len(loss_mask)] = torch.tensor(loss_mask, dtype=torch.float32)
    return ids, attention, mask[:, 1:]


def forward_logp(policy, ids: torch.Tensor, attention: torch.Tensor, *, entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``ids[:, 1:]`` under ``policy``, and the per-position entropy if asked."""
    logits = policy(input_ids=ids, attention_mask=attention).logits[:, :-1]
    return ppo.token_logprobs(logits, ids[:, 1:]), ppo.entropy_from_logits(logits) if entropy else None


# -- batched sampling ------------------------------------------------------------------------------


def next_token_logprobs(model, sequences: Sequence[Sequence[int]], pad_id: int = 0, *,
                        routing: list | None = None) -> torch.Tensor:  # fmt: skip
    """Log-probabilities of the next token after each sequence, ``[len(sequences), vocab]``, in one
    right-padded forward pass (causal attention: padding after a sequence cannot change it). With a
    ``routing`` list, it receives that forward's expert ids ``[len(sequences), width, layers, top_k]``."""
    ids, attention = pad_ids(sequences, pad_id)
    width = ids.shape[1]
    last = torch.tensor([len(s) - 1 for s in sequences])
    with torch.no_grad(), (record_routing(model) if routing is not None else nullcontext([])) as per_layer:
        logits = model(input_ids=ids, attention_mask=attention).logits
    if routing is not None:
        routing.append(stack_routing(per_layer, len(sequences), width))
    return torch.log_softmax(logits[torch.arange(len(sequences)), last].float(), dim=-1)


class BatchedSampler:
    """The generator: its own copy of the policy's weights (``publish`` replaces them, once per
    step) and one batched forward per round of next-token requests. With ``kv_cache`` (the
    default) each forward runs only the tokens its requests appended since their episode's last
    forward (``trainer/kv_cache.py``); ``forget`` releases an ended episode's cache."""

    def __init__(self, model, *, pad_id: int = 0, record_routing: bool | None = None, kv_cache: bool = True) -> None:
        self.model, self.pad_id = model.eval(), pad_id
        self.cache = PrefixCache() if kv_cache else None
        self.version = 0
        self.forwards = 0  # batched forward passes so far
        self.requests = 0  # next-token requests served so far
        self.records_routing = is_moe(model) if record_routing is None else record_routing  # default: MoE policies
        self.routing_shape = routing_shape(model)  # (MoE layers, top_k)
        self._pending: list[tuple[list[int], torch.Generator, asyncio.Future, list[int]]] = []

    def publish(self, state_dict: dict, version: int) -> None:
        """Load the trainer's current weights; trajectories sampled from now on carry ``version``."""
        self.model.load_state_dict(state_dict)
        self.version = version
        if self.cache is not None:
            self.cache.clear()  # computed with the old weights

    def forget(self, ids: Sequence[int]) -> None:
        """The episode that ``ids`` are the tokens of has ended: drop its cached prefixes."""
        if self.cache is not None:
            self.cache.forget(ids)

    async def sample(self, ids: Sequence[int], generator: torch.Generator | None) -> tuple[int, float]:
        """Sample the next token after ``ids`` with ``generator`` (None: greedy, the most likely
        token); returns ``(token, logprob)``."""
        token, logprob, _ = await self.sample_with_routing(ids, generator, ())
        return token, logprob

    async def sample_with_routing(self, ids: Sequence[int], generator: torch.Generator | None,
                                  positions: Sequence[int]) -> tuple[int, float, torch.Tensor | None]:  # fmt: skip
        """``sample``, plus this forward's routing at ``positions`` of ``ids``
        (``[len(positions), layers, top_k]``, int16; None when routing is not recorded)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((list(ids), generator, future, list(positions)))
        if len(self._pending) == 1:
            loop.call_soon(self._serve)  # after every coroutine already runnable has queued its request
        return await future

    def _forward(self, batch: list) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Next-token log-probs of every request, and each request's routing at its positions."""
        sequences = [p[0] for p in batch]
        if self.cache is not None:
            positions = [p[3] for p in batch] if self.records_routing else None
            return cached_next_token_logprobs(self.model, sequences, self.cache, self.pad_id, positions=positions)
        if not self.records_routing:
            return next_token_logprobs(self.model, sequences, self.pad_id), None
        routing: list[torch.Tensor] = []
        logprobs = next_token_logprobs(self.model, sequences, self.pad_id, routing=routing)
        return logprobs, [routing[0][row, p[3]].clone() for row, p in enumerate(batch)]

    def _serve(self) -> None:
        batch, self._pending = [p for p in self._pending if not p[2].cancelled()], []
        if not batch:
            return
        try:
            logprobs, routing = self._forward(batch)
            self.forwards, self.requests = self.forwards + 1, self.requests + len(batch)
            for row, (_, generator, future, positions) in enumerate(batch):
                if generator is None:
                    token = int(logprobs[row].argmax())
                else:
                    token = int(torch.multinomial(logprobs[row].exp(), 1, generator=generator))
                future.set_result((token, float(logprobs[row, token]), routing[row] if routing is not None else None))
        except Exception as exc:  # a failure fails every request not yet answered, never hangs them
            for _, _, future, _ in batch:
                if not future.done():
                    future.set_exception(exc)


# -- one episode -------------------------------------------------------------------------------------


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


async def drive_episode(env: AsyncTerminalEnv, instruction: str, sampler: BatchedSampler, chat: ChatFormat,
                        settings: RolloutSettings, generator: torch.Generator, trajectory: Trajectory) -> Step | None:  # fmt: skip
    """Run the policy on ``env`` (already reset) until the episode ends, filling ``trajectory``
    (and ``trajectory.routing`` when the sampler records routing)."""
    routed: dict[int, torch.Tensor] | None = {} if getattr(sampler, "records_routing", False) else None
    try:
        return await _drive(env, instruction, sampler, chat, settings, generator, trajectory, routed)
    finally:
        if hasattr(sampler, "forget"):
            sampler.forget(trajectory.ids)
        if routed is not None:
            layers, top_k = sampler.routing_shape
            trajectory.routing = torch.full((len(trajectory.ids), layers, top_k), NOT_RECORDED, dtype=ROUTING_DTYPE)
            for position, row in routed.items():
                trajectory.routing[position] = row


async def _drive(env, instruction: str, sampler, chat: ChatFormat, settings: RolloutSettings,
                 generator: torch.Generator, trajectory: Trajectory, routed: dict | None) -> Step | None:  # fmt: skip
    unconsumed: list[int] = []  # sampled positions no sampler forward has read yet

    async def sample() -> tuple[int, float]:
        if routed is None:
            return await sampler.sample(trajectory.ids, generator)
        token, logprob, rows = await sampler.sample_with_routing(trajectory.ids, generator, unconsumed)
        routed.update(zip(unconsumed, rows))
        unconsumed.clear()
        return token, logprob

    async def sample_turn() -> list[int]:  # a whole turn in one request (the vLLM generator)
        budget = min(settings.max_new_tokens, settings.max_context - len(trajectory.ids))
        if budget < 1:
            return []
        turn = await sampler.generate_turn(trajectory.ids, budget, chat.stop_ids, generator, list(unconsumed))
        if routed is not None:  # the prompt's unconsumed positions and all sampled ids but the last are now read
            routed.update(turn.routing or {})
            unconsumed[:] = [len(trajectory.ids) + len(turn.tokens) - 1] if turn.tokens else unconsumed
        trajectory.ids += turn.tokens
        trajectory.loss_mask += [1] * len(turn.tokens)
        trajectory.logprobs += turn.logprobs
        return list(turn.tokens)

    prompt = chat.prompt(instruction)
    trajectory.ids, trajectory.loss_mask, trajectory.logprobs = list(prompt), [0] * len(prompt), [0.0] * len(prompt)
    step: Step | None = None
    while not env.done:
        start, sampled = len(trajectory.ids), []
        if hasattr(sampler, "generate_turn"):
            sampled = await sample_turn()
        else:
            while len(sampled) < settings.max_new_tokens and len(trajectory.ids) < settings.max_context:
                token, logprob = await sample()
                unconsumed.append(len(trajectory.ids))
                trajectory.ids.append(token)
                trajectory.loss_mask.append(1)
                trajectory.logprobs.append(logprob)
                sampled.append(token)
                if token in chat.stop_ids:
                    break
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
    return Trajectory(**{
        **{k: getattr(trajectory, k) for k in trajectory.__dataclass_fields__},
        "ids": ids, "loss_mask": (trajectory.loss_mask + [0] * pad)[:n], "logprobs": (trajectory.logprobs + [0.0] * pad)[:n],
        "routing": None,  # positions moved: nothing to replay
    })  # fmt: skip


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

    def __init__(self, sampler: BatchedSampler, chat: ChatFormat, options: EnvOptions, pacer: Pacer,
                 settings: RolloutSettings, *, seed: int = 0,
                 sandbox_factory: Callable[[Task, EnvOptions], object] | None = None, binary_reward: bool = False) -> None:  # fmt: skip
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
        handle.writelines(json.dumps({"step": step, **json.loads(trajectory.to_json())}) + "\n" for trajectory in trajectories)
