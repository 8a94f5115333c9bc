"""The sandbox contract as data that crosses to a node: one frozen dataclass per operation, each a
``Call[T]`` that ``apply`` runs on the node's sandbox, returning a ``T``. The driver's
``RemoteSandbox`` sends one through the one actor method ``SandboxHost.call``; the type checker
sees the result's type at both ends, and no operation is named by a string.

A capability the node's sandbox lacks answers as ``termgym.sandboxes.capabilities`` says (None,
or a line saying why not). The node may refuse network (``Node.network_refusal``).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from termgym.sandboxes import capabilities
from termgym.sandboxes.base import Command, ExecResult, Sandbox

T = TypeVar("T")


class Node(Protocol):
    def network_refusal(self) -> str | None: ...


class Call(abc.ABC, Generic[T]):
    """One operation on a sandbox, applied on its node."""

    @abc.abstractmethod
    async def apply(self, sandbox: Sandbox, node: Node) -> T: ...


@dataclass(frozen=True)
class Run(Call[ExecResult]):
    command: Command

    async def apply(self, sandbox: Sandbox, node: Node) -> ExecResult:
        return await sandbox.run(self.command)


@dataclass(frozen=True)
class KillAgentProcesses(Call[None]):
    async def apply(self, sandbox: Sandbox, node: Node) -> None:
        await sandbox.kill_agent_processes()


@dataclass(frozen=True)
class UploadTar(Call[None]):
    archive: bytes
    dest: str
    timeout: float

    async def apply(self, sandbox: Sandbox, node: Node) -> None:
        await sandbox.upload_tar(self.archive, self.dest, timeout=self.timeout)


@dataclass(frozen=True)
class DownloadTar(Call[bytes]):
    paths: Sequence[str]
    limit: int
    timeout: float

    async def apply(self, sandbox: Sandbox, node: Node) -> bytes:
        return await sandbox.download_tar(self.paths, limit=self.limit, timeout=self.timeout)


@dataclass(frozen=True)
class CheckAlive(Call[None]):
    async def apply(self, sandbox: Sandbox, node: Node) -> None:
        await sandbox.check_alive()


@dataclass(frozen=True)
class LimitWarnings(Call[list[str]]):
    async def apply(self, sandbox: Sandbox, node: Node) -> list[str]:
        return await sandbox.limit_warnings()


@dataclass(frozen=True)
class ExecTraced(Call[ExecResult | None]):
    command: Command

    async def apply(self, sandbox: Sandbox, node: Node) -> ExecResult | None:
        return await capabilities.exec_traced(sandbox, self.command)


@dataclass(frozen=True)
class AgentChanges(Call[dict[str, str] | None]):
    async def apply(self, sandbox: Sandbox, node: Node) -> dict[str, str] | None:
        return await capabilities.agent_changes(sandbox)


@dataclass(frozen=True)
class SetNetwork(Call[str | None]):
    enabled: bool

    async def apply(self, sandbox: Sandbox, node: Node) -> str | None:
        refusal = node.network_refusal() if self.enabled else None
        if refusal is not None:  # the sandbox keeps the network it has: none, as started there
            return refusal
        return await capabilities.set_network(sandbox, self.enabled)


@dataclass(frozen=True)
class Keep(Call[dict[str, str]]):
    async def apply(self, sandbox: Sandbox, node: Node) -> dict[str, str]:
        return await capabilities.keep(sandbox)
