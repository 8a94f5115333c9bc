"""The driver's side of a Ray cluster: a ``Sandbox`` whose every call runs on its node's actor.

``RemoteSandbox`` forwards the contract to the ``SandboxHost`` of its node, by sandbox id, over the
Ray API: ``start``, ``stop`` and the process channel as the host's own methods, every other
operation (and the capabilities of the node's backend) as one typed call object
(``termgym.sandboxes.ray.calls``) through ``SandboxHost.call``. It has no host files, so
verification reads and writes through commands, as on Docker.

Faults: an exception the actor raised comes back as itself (a ``SandboxError`` stays one); a node
or actor that is gone (``RayActorError``, an unavailable actor, a dead node) is ``SandboxGone``, and
the node is marked down (``ClusterNode.down``) so that the scheduler stops placing trials there;
so is every other failure of Ray itself (an actor its node could no longer schedule, say).
``stop`` on a gone node returns: what the node left is its next actor's, or ``termgym gc --cluster``'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from termgym.aio import cancel_and_wait
from termgym.errors import SandboxGone
from termgym.sandboxes.base import Command, ExecResult, ProcessChannel, Sandbox, SandboxSpec
from termgym.sandboxes.ray.calls import (
    AgentChanges,
    Call,
    CheckAlive,
    DownloadTar,
    ExecTraced,
    Keep,
    KillAgentProcesses,
    LimitWarnings,
    Run,
    SetNetwork,
    T,
    UploadTar,
)
from termgym.sandboxes.ray.node import ClusterNode, remote
from termgym.sandboxes.ray.relay import Batch, Batches


class RemoteSandbox(Sandbox):
    """A sandbox of ``node``'s backend, running on that node (the module docstring says how)."""

    def __init__(self, spec: SandboxSpec, node: ClusterNode) -> None:
        super().__init__(spec)
        self.node = node
        self.backend = node.backend
        self.supports_users = node.backend == "docker"
        self.node_name = node.name
        self._id: str | None = None

    async def start(self) -> None:
        digest = await self.node.ship(self.spec)
        self._id, mirror = await remote(self.node, self.node.actor.start.remote(self.spec, digest))
        self._apply(mirror)

    def _apply(self, mirror: dict[str, Any]) -> None:
        self.env, self.workdir = mirror["env"], mirror["workdir"]
        self.warnings, self.image = mirror["warnings"], mirror["image"]
        self.untraced_loads = tuple(mirror["untraced_loads"])
        self.default_user = str(mirror.get("default_user") or "")

    def _sandbox_id(self) -> str:
        if self._id is None:
            raise SandboxGone(f"the sandbox on node {self.node.name} was not started, or was stopped")
        return self._id

    async def stop(self) -> None:
        sandbox_id, self._id = self._id, None
        if sandbox_id is None or self.node.down:
            return
        try:
            await remote(self.node, self.node.actor.stop.remote(sandbox_id))
        except SandboxGone:
            pass  # the node went with it: its next actor, or termgym gc --cluster, removes what is left

    async def _forward(self, call: Call[T]) -> T:
        """``call`` applied to this sandbox on its node (``SandboxHost.call``)."""
        return await remote(self.node, self.node.actor.call.remote(self._sandbox_id(), call))

    async def run(self, command: Command) -> ExecResult:
        return await self._forward(Run(_portable(command)))

    async def open_process(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, user: str | None = None
    ) -> ProcessChannel:
        call = self.node.actor.open_process.remote(self._sandbox_id(), user, list(argv), dict(env), cwd)
        return RemoteChannel(self.node, await remote(self.node, call))

    async def kill_agent_processes(self) -> None:
        await self._forward(KillAgentProcesses())

    async def upload_tar(self, archive: bytes, dest: str, *, timeout: float = 120.0) -> None:
        await self._forward(UploadTar(archive, dest, timeout))

    async def download_tar(self, paths: Sequence[str], *, limit: int, timeout: float = 120.0) -> bytes:
        return await self._forward(DownloadTar(list(paths), limit, timeout))

    async def check_alive(self) -> None:
        await self._forward(CheckAlive())

    async def limit_warnings(self) -> list[str]:
        return await self._forward(LimitWarnings())

    # the capabilities (termgym.sandboxes.capabilities) of the node's backend, local or docker

    async def exec_traced(self, command: Command) -> ExecResult | None:
        return await self._forward(ExecTraced(_portable(command)))

    async def agent_changes(self) -> dict[str, str] | None:
        return await self._forward(AgentChanges())

    async def set_network(self, enabled: bool) -> str | None:
        return await self._forward(SetNetwork(enabled))

    async def keep(self) -> dict[str, str]:
        kept = await self._forward(Keep())
        self._id = None  # stop() leaves a kept sandbox alone
        return {**kept, "node": self.node.name}


def _portable(command: Command) -> Command:
    """``command`` with plain lists and dicts (what Ray pickles as such)."""
    env = dict(command.env) if command.env is not None else None
    return replace(command, argv=list(command.argv), env=env)


class RemoteChannel(ProcessChannel):
    """A process in a remote sandbox. Its output is relayed as ``termgym.sandboxes.ray.relay`` says:
    a long poll kept outstanding while the reader waits, and ``write_expecting`` as one exchange
    that brings the awaited output back with it. A fault of either is raised by the next ``read``."""

    def __init__(self, node: ClusterNode, channel_id: str) -> None:
        self.node, self.channel_id = node, channel_id
        self._closed = False
        self._batches = Batches()
        self._arrived = asyncio.Event()
        self._poll: asyncio.Task[None] | None = None
        self._exchange: asyncio.Task[None] | None = None
        self._error: Exception | None = None

    async def write(self, data: bytes) -> None:
        await self._settled()
        await remote(self.node, self.node.actor.write.remote(self.channel_id, data))

    async def write_expecting(self, data: bytes, end: bytes) -> None:
        await self._settled()
        self._exchange = asyncio.create_task(self._deliver(self.node.actor.exchange.remote(self.channel_id, data, end)))

    async def _settled(self) -> None:
        """The last exchange answered (so its data is written): writes reach the process in order."""
        if self._exchange is not None:
            await asyncio.shield(self._exchange)

    async def _deliver(self, call: Awaitable[Batch | None]) -> None:
        try:
            self._batches.add(await remote(self.node, call))
        except Exception as exc:  # SandboxGone, or the channel's own fault on the node
            self._error = exc
        self._arrived.set()

    async def read(self, max_bytes: int) -> bytes:
        while True:
            if self._batches:
                return self._batches.take(max_bytes)
            if self._batches.eof:
                return b""
            if self._error is not None:
                raise self._error
            if self._poll is None or self._poll.done():
                self._poll = asyncio.create_task(self._deliver(self.node.actor.read.remote(self.channel_id)))
            self._arrived.clear()
            await self._arrived.wait()

    async def wait(self) -> int | None:
        return await remote(self.node, self.node.actor.wait.remote(self.channel_id))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await cancel_and_wait(self._poll, self._exchange)
        if self.node.down:
            return
        try:
            await remote(self.node, self.node.actor.close.remote(self.channel_id))
        except SandboxGone:
            pass
