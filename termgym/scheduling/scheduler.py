"""Rollout scheduling: launch more trials than a batch needs, keep the first B that finish, and
measure (and, in two modes, correct) the straggler bias that cutting the tail causes.

A step draws tasks from a ``TaskPool`` (each task once per epoch, reshuffled every epoch), launches
them through a ``Runner`` over rollout nodes that each cap how many run at once
(``termgym.scheduling.pool``), and paces sandbox creation with one shared
``termgym.sandboxes.pacing.Pacer``. The mode (``wait``, ``cancel``, ``carry-over``, ``reweight``)
says what happens past the first B; ``SchedulerConfig.clock`` (``wall`` or ``work``) what "first" is.

Guarantees: never more than B kept per step (fewer only when failures exhaust their retries:
``BatchResult.short``); a failed trial never counts as finished, and a ``sandbox_error`` or
``model_error`` is replaced by a fresh trial of the same task, up to ``retries`` times per launch;
no node runs more than its cap; every creation goes through the pacer; a cancelled trial's sandbox
is stopped before ``step()`` returns and its record (``cancelled``) reported; ``close()`` cancels
what is carried. ``BatchResult`` (``termgym.scheduling.bias``) holds each step's accounting,
``step_metrics`` makes it one JSON object. The modes, clocks and their measured costs:
docs/guides/scheduling.md."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar, cast, get_args

from termgym.aio import cancel_and_wait
from termgym.errors import ConfigError, SandboxError, UnknownName
from termgym.records import ErrorKind, TrialRecord
from termgym.sandboxes.pacing import Pacer
from termgym.sandboxes.placement import placed_on
from termgym.scheduling import bias
from termgym.scheduling.bias import Fate
from termgym.scheduling.pool import Node, NodePool, TaskPool
from termgym.scheduling.runners import Runner, TrialProgress
from termgym.tasks import Task

T = TypeVar("T")
SchedulerMode = Literal["wait", "cancel", "carry-over", "reweight"]
MODES: tuple[SchedulerMode, ...] = get_args(SchedulerMode)
SchedulerClock = Literal["wall", "work"]
CLOCKS: tuple[SchedulerClock, ...] = get_args(SchedulerClock)
FAILED_KINDS = ("sandbox_error", "model_error", "build_failed", "invalid_task")  # not finished: no verdict
RETRYABLE_KINDS = ("sandbox_error", "model_error")  # a fresh sandbox or request may work; a broken task never will


# -- the scheduler -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchedulerConfig:
    batch_size: int  # B: trials kept per step
    launch: int | None = None  # N: trials launched per step (None: B x 560/512); wait mode launches B
    mode: SchedulerMode = "cancel"
    nodes: tuple[Node, ...] = (Node("node-0", 64),)
    retries: int = 2  # replacements per launch after sandbox errors
    # whether a node takes trials now (a Ray cluster's node that died does not); None: every node
    node_up: Callable[[str], bool] | None = None
    clock: SchedulerClock = "wall"  # what "the first B to finish" is measured on (module docstring)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UnknownName("unknown mode", self.mode, MODES)
        if self.clock not in CLOCKS:
            raise UnknownName("unknown clock", self.clock, CLOCKS)
        if self.batch_size < 1:
            raise ConfigError(f"the batch size must be at least 1, got {self.batch_size}")
        if self.launch is not None and self.launch < self.batch_size:
            raise ConfigError(f"launching {self.launch} trials cannot fill a batch of {self.batch_size}")
        if self.retries < 0 or not self.nodes:
            raise ConfigError("retries must be >= 0 and at least one node is needed")

    @property
    def launched_per_step(self) -> int:
        if self.mode == "wait":
            return self.batch_size
        return self.launch if self.launch is not None else bias.launch_count(self.batch_size)


@dataclass(frozen=True)
class KeptTrial(Generic[T]):
    """One trajectory of the batch, as the trainer consumes it."""

    result: T  # what run_one returned
    record: TrialRecord
    weight: float  # importance weight (reweight mode; mean 1 over the batch), 1.0 in other modes
    policy_version: int  # the policy version the trial was launched under
    staleness: int  # this step's version minus policy_version (>= 1 only for carried trials)
    duration: float  # seconds on the loop clock, from the sandbox's creation grant to the end
    node: str


@dataclass(frozen=True)
class BatchResult(Generic[T]):
    step: int
    mode: SchedulerMode
    policy_version: int
    kept: list[KeptTrial[T]]
    records: list[tuple[Fate, TrialRecord]]  # (fate, record) of every trial decided in this step
    families: bias.BiasReport
    tasks: bias.BiasReport
    run_families: bias.BiasReport  # cumulative, since the scheduler was made
    run_tasks: bias.BiasReport
    wall_seconds: float  # from the step's start until it returned (cancelled sandboxes released)
    batch_seconds: float  # from the step's start until the batch was full
    pacing_seconds: float  # what pacing alone needs to create this step's launched trials
    lower_bound: float  # max(pacing_seconds, the longest kept trial's time within this step)
    short: int  # trials missing from the batch (failures without retries left)
    node_peaks: dict[str, int] = field(default_factory=dict)

    @property
    def effective_sample_size(self) -> float:
        return bias.effective_sample_size([k.weight for k in self.kept])


@dataclass(eq=False)
class _Trial:
    task: Task
    version: int
    attempt: int
    index: int  # its launch index in its step (replacements follow the first launches)
    progress: TrialProgress = field(default_factory=TrialProgress)
    future: asyncio.Task[Any] | None = None
    node: Node | None = None
    ended_at: float | None = None


@dataclass(frozen=True)
class _Decided(Generic[T]):
    trials: list[tuple[_Trial, Fate, TrialRecord, T | None]]  # (trial, fate, record, result), in decision order
    batch_full: float | None  # loop time the batch was full (the wall clock's collection)


def _ignore_failure(future: asyncio.Future) -> None:
    if not future.cancelled():
        future.exception()  # retrieved, so it is never reported as unhandled


class RolloutScheduler(Generic[T]):
    """Runs steps of B kept trials (see the module docstring). One step at a time; in carry-over
    mode the tail of one step keeps running into the next, and ``close()`` ends it."""

    def __init__(
        self,
        runner: Runner[T],
        pool: TaskPool,
        config: SchedulerConfig,
        *,
        pacer: Pacer,
        on_record: Callable[[Fate, TrialRecord], None] | None = None,
    ) -> None:
        self.runner, self.pool, self.config, self.pacer = runner, pool, config, pacer
        self.on_record = on_record  # called with (fate, record) as soon as each trial is decided
        self.nodes = NodePool(config.nodes, is_up=config.node_up)
        self.steps = 0
        self._carried: list[_Trial] = []
        self._done: asyncio.Queue[_Trial] = asyncio.Queue()  # trials in the order they ended
        self._run_families: dict[str, bias.Tally] = {}
        self._run_tasks: dict[str, bias.Tally] = {}
        self._prewarming: asyncio.Future[int] | None = None
        self._left: dict[_Trial, float] = {}  # work clock: a carried trial's work left after its step's cut

    async def step(self, policy_version: int | None = None) -> BatchResult[T]:
        """Run one step; ``policy_version`` (default: the step's index) tags the trials it launches."""
        loop = asyncio.get_running_loop()
        index, self.steps = self.steps, self.steps + 1
        version = index if policy_version is None else policy_version
        started = loop.time()
        carried, self._carried = self._carried, []
        draw = self.pool.draw(max(self.config.launched_per_step - len(carried), 0))
        launched = [self._launch(task, version, attempt=0, index=i) for i, task in enumerate(draw)]
        on_work = self.config.clock == "work" and self.config.mode != "wait"
        decided = await (self._collect_on_work if on_work else self._collect_on_wall)(carried, launched, version)
        batch_full = decided.batch_full if decided.batch_full is not None else loop.time()
        self._prewarm_next()
        return self._result(index, version, started, batch_full, launched, decided.trials)

    async def _collect_on_wall(self, carried: list[_Trial], launched: list[_Trial], version: int) -> _Decided[T]:
        """Keep the first B trials to end on the loop's clock; then cancel or carry the rest."""
        loop = asyncio.get_running_loop()
        batch = self.config.batch_size
        in_flight = dict.fromkeys(carried)  # an ordered set
        in_flight.update(dict.fromkeys(launched))
        decided: list[tuple[_Trial, Fate, TrialRecord, T | None]] = []  # (trial, fate, record, result)
        kept = 0
        try:
            while kept < batch and in_flight:
                trial = await self._done.get()
                if trial not in in_flight:  # cancelled in an earlier step
                    continue
                del in_flight[trial]
                fate, record, result = self._settle(trial, room=True)
                decided.append((trial, fate, record, result))
                kept += fate == "kept"
                if fate == "failed" and kept < batch and self._retryable(record, trial):
                    launched.append(self._launch(trial.task, version, trial.attempt + 1, len(launched)))
                    in_flight[launched[-1]] = None
            batch_full = loop.time()
            if self.config.mode == "carry-over":
                self._carried = list(in_flight)
            else:
                await self._cancel(in_flight)
                decided += [(trial, *self._settle(trial, room=False)) for trial in in_flight]
        except BaseException:
            await self._cancel(in_flight)
            raise
        return _Decided(decided, batch_full)

    async def _collect_on_work(self, carried: list[_Trial], launched: list[_Trial], version: int) -> _Decided[T]:
        """Let every trial end (failed ones replaced as on the wall clock), then keep the first B by
        ``bias.simulated_finish``: the carried-in trials first (with the work they had left), then
        the launched ones in launch order, on as many slots as the nodes' caps add up to, each
        running for its work (the runner's ``work_of``, else its turns). The rest are surplus, or
        carried (cancel and reweight cut them, carry-over keeps them for the next step)."""
        in_flight = dict.fromkeys(launched)
        ended: dict[_Trial, tuple[TrialRecord, T | None]] = {}
        decided: list[tuple[_Trial, Fate, TrialRecord, T | None]] = []
        try:
            while in_flight:
                trial = await self._done.get()
                if trial not in in_flight:  # a trial of an earlier step
                    continue
                del in_flight[trial]
                record, result = ended[trial] = self._ended(trial)
                if self._fate(record, room=True) == "failed":
                    decided.append((trial, self._decide(record, room=True), record, result))
                    if self._retryable(record, trial):
                        launched.append(self._launch(trial.task, version, trial.attempt + 1, len(launched)))
                        in_flight[launched[-1]] = None
        except BaseException:
            await self._cancel(in_flight)
            raise
        for trial in carried:
            ended[trial] = self._ended(trial)
        order = [*carried, *launched]
        works = [self._left.pop(t) if t in self._left else self._work(*ended[t]) for t in order]
        finish = bias.simulated_finish(works, sum(node.cap for node in self.config.nodes))
        candidates = [i for i, t in enumerate(order) if self._fate(ended[t][0], room=True) != "failed"]
        first = bias.first_to_finish([finish[i] for i in candidates], self.config.batch_size)
        kept = [candidates[i] for i in first]
        cut, chosen = max((finish[i] for i in kept), default=0.0), set(kept)
        rest = [i for i in sorted(candidates, key=lambda i: (finish[i], i)) if i not in chosen]
        for i in kept:
            record, result = ended[order[i]]
            decided.append((order[i], self._decide(record, room=True), record, result))
        if self.config.mode == "carry-over":
            self._carried = [order[i] for i in rest]
            self._left = {order[i]: finish[i] - cut for i in rest}
        else:
            for i in rest:
                record, result = ended[order[i]]
                decided.append((order[i], self._decide(record, room=False), record, result))
        return _Decided(decided, None)

    def _prewarm_next(self) -> None:
        """Start making the next step's sandboxes ready (the runner's optional ``prewarm``, given
        the tasks the next step will draw) while the trainer updates: the next step's trials then
        start on ready ones. Creations made this way are not paced: only backends that keep a warm
        pool (Docker, a local engine) make any. A failed prewarm only means the trials create their
        own sandboxes."""
        prewarm = getattr(self.runner, "prewarm", None)
        if prewarm is None or (self._prewarming is not None and not self._prewarming.done()):
            return
        upcoming = self.pool.peek(max(self.config.launched_per_step - len(self._carried), 0))
        prewarming = asyncio.ensure_future(prewarm(upcoming))
        prewarming.add_done_callback(_ignore_failure)
        self._prewarming = prewarming

    async def close(self) -> list[TrialRecord]:
        """End the trials still carried (carry-over mode): cancelled (error kind ``cancelled``), or
        surplus if they had already finished. Their records go to ``on_record`` and into the run's
        accounting, and are returned."""
        carried, self._carried = self._carried, []
        prewarming, self._prewarming = self._prewarming, None
        await cancel_and_wait(prewarming)
        await self._cancel(carried)
        settled = [(trial, *self._settle(trial, room=False)) for trial in carried]
        self._account([self._outcome(t, fate, record, launched=False) for t, fate, record, _ in settled])
        return [record for _, _, record, _ in settled]

    async def __aenter__(self) -> RolloutScheduler[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def run_families(self) -> bias.BiasReport:
        return bias.bias_report(self._run_families)

    # -- internals ---------------------------------------------------------------------------------

    def _launch(self, task: Task, version: int, attempt: int, index: int) -> _Trial:
        trial = _Trial(task, version, attempt, index)
        trial.progress.launch = index
        trial.future = asyncio.create_task(self._run(trial), name=f"trial {task.name}")
        trial.future.add_done_callback(lambda _: self._done.put_nowait(trial))
        return trial

    async def _run(self, trial: _Trial) -> T:
        node = await self.nodes.acquire()
        trial.node = node
        try:
            with placed_on(node.name):
                return await self.runner.run_one(trial.task, node, trial.version, trial.progress)
        finally:
            self.nodes.release(node)
            trial.ended_at = asyncio.get_running_loop().time()

    async def _cancel(self, trials: Iterable[_Trial]) -> None:
        """Cancel and wait until each trial has unwound (its sandbox stopped)."""
        futures = [trial.future for trial in trials if trial.future is not None]
        for future in futures:
            future.cancel()
        await asyncio.gather(*futures, return_exceptions=True)

    def _settle(self, trial: _Trial, *, room: bool) -> tuple[Fate, TrialRecord, T | None]:
        """The fate and record of a trial whose task is done. ``room``: the batch still has room
        (otherwise a finished trial is surplus)."""
        record, result = self._ended(trial)
        return self._decide(record, room=room), record, result

    def _ended(self, trial: _Trial) -> tuple[TrialRecord, T | None]:
        """The record (and result, when the runner returned one) of a trial whose task is done."""
        future = trial.future
        assert future is not None, "settled before it was launched"
        if future.cancelled():
            return self._bare_record(trial, "cancelled", "cancelled: the batch was full"), None
        try:
            value = future.result()
        except SandboxError as exc:
            return self._bare_record(trial, "sandbox_error", str(exc)), None
        return self.runner.record_of(value), value

    @staticmethod
    def _fate(record: TrialRecord, *, room: bool) -> Fate:
        kind = record.error["kind"] if record.error else None
        return (
            "cancelled" if kind == "cancelled" else "failed" if kind in FAILED_KINDS else "kept" if room else "surplus"
        )

    def _decide(self, record: TrialRecord, *, room: bool) -> Fate:
        """The record's fate, told to ``on_record``."""
        fate = self._fate(record, room=room)
        if self.on_record is not None:
            self.on_record(fate, record)
        return fate

    def _work(self, record: TrialRecord, result: T | None) -> float:
        """A trial's work on the ``work`` clock: the runner's ``work_of(result)`` when it has one
        and the trial returned a result, else its turns."""
        work_of = getattr(self.runner, "work_of", None)
        return float(work_of(result)) if work_of is not None and result is not None else float(record.turns)

    def _retryable(self, record: TrialRecord, trial: _Trial) -> bool:
        return (
            record.error is not None and record.error["kind"] in RETRYABLE_KINDS and trial.attempt < self.config.retries
        )

    def _bare_record(self, trial: _Trial, kind: ErrorKind, message: str) -> TrialRecord:
        return TrialRecord(
            task=trial.task.name,
            backend=self.runner.backend,
            agent=self.runner.agent_name,
            turns=trial.progress.turns,
            error={"kind": kind, "message": message},
            timings={"total": self._duration(trial)},
            run_id=self.runner.run_id,
            trial_id=uuid.uuid4().hex[:12],
            family=trial.task.family,
        )

    def _duration(self, trial: _Trial, since: float = -math.inf) -> float:
        """Loop seconds from the creation grant (or ``since``, if later) to the end, or to now."""
        end = trial.ended_at if trial.ended_at is not None else asyncio.get_running_loop().time()
        start = trial.progress.created_at if trial.progress.created_at is not None else end
        return max(end - max(start, since), 0.0)

    def _outcome(
        self, trial: _Trial, fate: Fate, record: TrialRecord | None, *, launched: bool, weight: float = 1.0
    ) -> bias.TrialOutcome:
        turns = record.turns if record is not None else trial.progress.turns
        return bias.TrialOutcome(
            trial.task.name, trial.task.family, fate, launched, self._duration(trial), turns, weight
        )

    def _account(self, outcomes: list[bias.TrialOutcome]) -> tuple[dict[str, bias.Tally], dict[str, bias.Tally]]:
        families, tasks = bias.tally(outcomes), bias.tally(outcomes, key=lambda o: o.task)
        self._run_families = bias.merge_tallies(self._run_families, families)
        self._run_tasks = bias.merge_tallies(self._run_tasks, tasks)
        return families, tasks

    def _result(
        self,
        index: int,
        version: int,
        started: float,
        batch_full: float,
        launched: list[_Trial],
        decided: list[tuple[_Trial, Fate, TrialRecord, T | None]],
    ) -> BatchResult[T]:
        # a kept trial's result is there: only a finished runner call gives a record that can be kept
        kept = [(t, record, cast(T, result)) for t, fate, record, result in decided if fate == "kept"]
        weights: dict[str, float] = {}
        if self.config.mode == "reweight":
            launched_per_family = Counter(t.task.family for t in launched)
            weights = bias.importance_weights(launched_per_family, Counter(t.task.family for t, _, _ in kept))
        new = set(launched)
        outcomes = [
            self._outcome(t, fate, r, launched=t in new, weight=weights.get(t.task.family, 1.0))
            for t, fate, r, _ in decided
        ]
        outcomes += [self._outcome(t, "carried", None, launched=t in new) for t in self._carried]
        families, tasks = self._account(outcomes)
        pacing = bias.pacing_seconds(len(launched), self.pacer.windows)
        return BatchResult(
            step=index,
            mode=self.config.mode,
            policy_version=version,
            kept=[
                KeptTrial(
                    result=result,
                    record=record,
                    weight=weights.get(t.task.family, 1.0),
                    policy_version=t.version,
                    staleness=version - t.version,
                    duration=self._duration(t),
                    node=t.node.name if t.node else "",
                )
                for t, record, result in kept
            ],
            records=[(fate, record) for _, fate, record, _ in decided],
            families=bias.bias_report(families),
            tasks=bias.bias_report(tasks),
            run_families=bias.bias_report(self._run_families),
            run_tasks=bias.bias_report(self._run_tasks),
            wall_seconds=asyncio.get_running_loop().time() - started,
            batch_seconds=batch_full - started,
            pacing_seconds=pacing,
            lower_bound=bias.step_lower_bound(pacing, (self._duration(t, since=started) for t, _, _ in kept)),
            short=self.config.batch_size - len(kept),
            node_peaks={node.name: peak for node, peak in zip(self.nodes.nodes, self.nodes.peak)},
        )


def step_metrics(result: BatchResult) -> dict:
    """One JSON object for the run's ``metrics.jsonl``: the step's timing and its accounting, per
    family and per task, for the step and for the run so far."""
    timing = (
        "step",
        "mode",
        "policy_version",
        "short",
        "wall_seconds",
        "batch_seconds",
        "pacing_seconds",
        "lower_bound",
        "node_peaks",
    )
    return {
        **{name: getattr(result, name) for name in timing},
        "kept": len(result.kept),
        "effective_sample_size": result.effective_sample_size,
        "max_staleness": max((k.staleness for k in result.kept), default=0),
        "families": result.families.to_dict(),
        "tasks": result.tasks.to_dict(),
        "run": {"families": result.run_families.to_dict(), "tasks": result.run_tasks.to_dict()},
    }
