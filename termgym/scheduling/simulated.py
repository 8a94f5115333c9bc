"""Simulated sandboxes: the real environment and trial code, with a latency model instead of a machine.

A ``SimulatedSandbox`` is a ``Sandbox`` subclass, driven through the real ``AsyncTerminalEnv`` and
``termgym.trial.run_trial`` by ``SimulatedAgent``, so a simulated trial takes the very path a real
one takes; only the machine is simulated: each sandbox follows a ``latency.TrialPlan`` drawn when
it is made and waits on the event loop's clock (creation, each turn, the verifier, deletion).
Rewards are binary as planned; a plan can fail creation (``SandboxError``) or lose the sandbox
mid-trial (``SandboxGone``), recorded as ``sandbox_error``. ``SimulatedBackend`` is the sandbox
factory and the ledger tests check (every creation request with its loop time, the sandboxes alive,
the peak, every release). Not simulated: file contents, command output, per-assertion reports.

How the shell and verifier answer, and what the record's timings mean:
docs/guides/scheduling.md#simulation."""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from termgym.env import SUBMIT, AsyncTerminalEnv
from termgym.episode.options import EnvOptions
from termgym.errors import SandboxError, SandboxGone
from termgym.sandboxes.base import Command, ExecResult, ProcessChannel, Sandbox, SandboxSpec, refuse_user
from termgym.scheduling.latency import BUNDLED, LatencyModel, TrialPlan, plan_trial
from termgym.tasks import Task

SIM_DONE = "[simulated: the agent is done]"
_COMMAND = re.compile(r"^__tg_run [^\n]*\n(\S+)\n", re.MULTILINE)  # the command line, then its nonce


class SimulatedBackend:
    """The sandbox factory for simulated trials (``AsyncTerminalEnv(sandbox_factory=...)``), and
    the ledger of what it created and released. Plans are drawn from one seeded generator, in the
    order sandboxes are made."""

    def __init__(self, model: LatencyModel = BUNDLED, *, seed: int = 0) -> None:
        self.model = model
        self._rng = random.Random(seed)
        self._ids = 0
        self.requests: list[float] = []  # loop time of every creation request
        self.live: set[int] = set()  # sandboxes created and not yet released
        self.created = 0
        self.released = 0
        self.peak_live = 0

    def __call__(self, task: Task, options: EnvOptions) -> SimulatedSandbox:
        self._ids += 1
        spec = SandboxSpec(
            name=task.name,
            context_dir=None,
            dockerfile=None,
            labels={"termgym": "1", "termgym.run": options.run_id or "adhoc"},
        )
        sandbox = SimulatedSandbox(spec, plan_trial(self.model, task.family, self._rng), self, self._ids)
        if task.report_format == "ctrf":
            sandbox.report_assertions = task.expected_assertions or 1
        return sandbox

    def options(self, run_id: str = "") -> EnvOptions:
        """Env options under which no planned turn hits a turn budget or a timeout."""
        return EnvOptions(
            backend="simulated",
            max_turns=self.model.max_turns,
            command_timeout=self.model.max_agent_seconds + 1,
            agent_timeout=self.model.max_agent_seconds * 10,
            run_id=run_id,
        )


class SimulatedSandbox(Sandbox):
    backend = "simulated"

    def __init__(self, spec: SandboxSpec, plan: TrialPlan, ledger: SimulatedBackend, ident: int) -> None:
        super().__init__(spec)
        self.plan = plan
        self.ident = ident
        self._ledger = ledger
        self._alive = False
        self.lost = False
        self.turns_done = 0
        self.report_assertions = 0  # assertions in a simulated ctrf.json; 0: the verifier writes no report
        self._shells: list[_SimulatedShell] = []

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._ledger.requests.append(loop.time())
        await asyncio.sleep(self.plan.create_seconds)
        if self.plan.create_fails:
            raise SandboxError("simulated provider error: the sandbox could not be created")
        self._alive = True
        self._ledger.live.add(self.ident)
        self._ledger.created += 1
        self._ledger.peak_live = max(self._ledger.peak_live, len(self._ledger.live))
        self.workdir = "/app"

    async def stop(self) -> None:
        for shell in self._shells:
            await shell.close()
        self._shells.clear()
        if not self._alive:
            return
        self._alive = False  # first, so a second stop() is a no-op even while this one waits
        await asyncio.sleep(self.plan.release_seconds)
        self._ledger.live.discard(self.ident)
        self._ledger.released += 1

    async def run(self, command: Command) -> ExecResult:
        argv, timeout = command.argv, command.timeout
        refuse_user(self, command.user)
        self._check()
        if len(argv) == 1 and argv[0].startswith("/tests/"):  # the task's test script
            if self.plan.verify_seconds > timeout:
                await asyncio.sleep(timeout)
                return ExecResult(None, b"", timed_out=True)
            await asyncio.sleep(self.plan.verify_seconds)
            return ExecResult(0 if self.plan.resolved else 1, b"")
        if self.report_assertions and any("cd /logs/verifier" in word for word in argv):  # the reports are read
            return ExecResult(0, self._report())
        return ExecResult(0, b"")

    def _report(self) -> bytes:
        """The report stream (``name NUL size NUL bytes``) of a ctrf.json with the planned outcome."""
        status = "passed" if self.plan.resolved else "failed"
        tests = [{"name": f"simulated {i + 1}", "status": status} for i in range(self.report_assertions)]
        data = json.dumps({"results": {"tests": tests}}).encode()
        return b"ctrf.json\0" + str(len(data)).encode() + b"\0" + data

    async def upload_tar(self, archive: bytes, dest: str, *, timeout: float = 120.0) -> None:
        self._check()

    async def open_process(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, user: str | None = None
    ) -> ProcessChannel:
        refuse_user(self, user)
        self._check()
        shell = _SimulatedShell(self)
        self._shells.append(shell)
        return shell

    async def kill_agent_processes(self) -> None:
        self._check()
        for shell in self._shells:
            await shell.close()
        self._shells.clear()

    def next_turn(self) -> tuple[float, str, bool]:
        """(seconds, output, lost) for the next command the agent runs."""
        index = self.turns_done
        self.turns_done += 1
        turns = self.plan.turn_seconds
        if index >= len(turns):
            return 0.0, SIM_DONE, False
        output = f"[simulated turn {index + 1}/{len(turns)}]" + (f"\n{SIM_DONE}" if index == len(turns) - 1 else "")
        return turns[index], output, index == self.plan.lost_at_turn

    def _check(self) -> None:
        if self.lost:
            raise SandboxGone("simulated: the sandbox was lost")
        if not self._alive:
            raise SandboxError("simulated: the sandbox is not running")


class _SimulatedShell(ProcessChannel):
    """Answers the persistent shell's bootstrap and framed commands after each turn's planned time."""

    def __init__(self, sandbox: SimulatedSandbox) -> None:
        self._sandbox = sandbox
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self._exited: asyncio.Future[int] = loop.create_future()
        self._timers: list[asyncio.TimerHandle] = []
        self._pending = b""

    async def write(self, data: bytes) -> None:
        if self._exited.done():
            raise SandboxGone("simulated: the shell has exited")
        text = data.decode("utf-8", errors="replace")
        if "__TG_READY_" in text:
            self._chunks.put_nowait(b"\n__TG_READY_ 1 /app\n__TG_READY_END\n")
        for match in _COMMAND.finditer(text):
            seconds, output, lost = self._sandbox.next_turn()
            self._timers.append(self._loop.call_later(seconds, self._answer, match.group(1), output, lost))

    def _answer(self, nonce: str, output: str, lost: bool) -> None:
        if lost:
            self._sandbox.lost = True
            self._end()
            return
        self._chunks.put_nowait(f"{output}\n__TG_{nonce}_ 0 /app\n__TG_{nonce}_END\n".encode())

    async def read(self, max_bytes: int) -> bytes:
        if not self._pending:
            if self._chunks.empty() and self._exited.done():
                return b""
            self._pending = await self._chunks.get()
        chunk, self._pending = self._pending[:max_bytes], self._pending[max_bytes:]
        return chunk

    async def wait(self) -> int | None:
        return await asyncio.shield(self._exited)

    async def close(self) -> None:
        self._end()

    def _end(self) -> None:
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        if not self._exited.done():
            self._exited.set_result(0)
            self._chunks.put_nowait(b"")  # wakes a blocked reader with end-of-file


@dataclass(frozen=True)
class SimulatedAgent:
    """Works until the simulated sandbox says the planned turns are done, then submits."""

    name: str = "simulated"

    async def run(self, env: AsyncTerminalEnv, instruction: str, info: dict):
        step = None
        while True:
            step = await env.step("work")
            if env.done:
                return step
            if SIM_DONE in step[0]:
                return await env.step(SUBMIT)
