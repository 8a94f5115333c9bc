"""What only some backends can do, as optional protocols a ``Sandbox`` subclass may also satisfy,
and one function each that callers use: it answers as a backend without the capability would
(None, or one line saying why not) when the sandbox lacks it.

- ``Tracing.exec_traced(command)``: the command under the system-call tracer (the tamper check's
  evidence). Without it: None, and the caller assumes the worst.
- ``ListsChanges.agent_changes()``: what the agent changed since the environment was ready. Without
  it: None (cannot tell).
- ``Keeps.keep()``: leave the sandbox running past this process (``--keep``). Without it:
  ``SandboxError``.
- ``SwitchesNetwork.set_network(enabled)``: the network between phases. Without it: the network
  chosen at creation stays, and a line says so when another was asked.
- ``ReachesFiles.host_files()``: the sandbox's files from the host while none of its processes runs
  (``HostFiles``). Without it: None, use commands.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from termgym.errors import SandboxError
from termgym.sandboxes.base import Command, ExecResult, Sandbox


@runtime_checkable
class Tracing(Protocol):
    async def exec_traced(self, command: Command) -> ExecResult | None:
        """``command`` under the tracer (``termgym.sandboxes.tracing.traced_argv``), its stream in
        ``ExecResult.trace``, apart from the output (the command's stderr joins its stdout); None
        where this sandbox cannot trace now."""
        ...


@runtime_checkable
class ListsChanges(Protocol):
    async def agent_changes(self) -> dict[str, str] | None:
        """Every file the sandbox's processes added (``A``), changed (``C``) or deleted (``D``) since
        the environment was ready, as absolute paths (directories only where nothing under them is
        listed), after ``kill_agent_processes``; None where it cannot tell."""
        ...


@runtime_checkable
class Keeps(Protocol):
    async def keep(self) -> dict[str, str]:
        """Leave the sandbox running past this process instead of stopping it; returns ``{"backend",
        "id", "attach", "remove"}`` (the commands that enter and remove it). After it, ``stop``
        leaves the sandbox alone."""
        ...


@runtime_checkable
class SwitchesNetwork(Protocol):
    async def set_network(self, enabled: bool) -> str | None:
        """Give the running sandbox network (``enabled``) or take it away; None when it now has what
        was asked, else one line saying why not (the sandbox is left as it was)."""
        ...


class HostFiles(Protocol):
    """A sandbox's files reached from the host while none of its processes runs. Paths are
    absolute paths as the sandbox sees them; every operation reaches them without following a link
    the agent left and raises ``OSError`` when it cannot."""

    def fresh_dirs(self, paths: Sequence[str]) -> None:
        """Make each path a fresh empty directory, whatever is there now."""
        ...

    def write_files(self, dest: str, files: Sequence[tuple[str, bytes, int]]) -> None:
        """Write ``(relative path, content, mode)`` under the fresh directory ``dest``."""
        ...

    def list_files(self, directory: str, wanted: Callable[[str], bool]) -> list[str] | None:
        """The names ``wanted`` accepts of the regular files at the top of ``directory``, sorted;
        None when it is not a directory."""
        ...

    def read_files(self, directory: str, names: Sequence[str], cap: int) -> dict[str, bytes]:
        """The regular files ``names`` at the top of ``directory``, each cut at ``cap`` bytes."""
        ...


@runtime_checkable
class ReachesFiles(Protocol):
    def host_files(self) -> HostFiles | None:
        """The files from the host now (after ``kill_agent_processes``), or None: use commands."""
        ...


async def exec_traced(sandbox: Sandbox, command: Command) -> ExecResult | None:
    return await sandbox.exec_traced(command) if isinstance(sandbox, Tracing) else None


async def agent_changes(sandbox: Sandbox) -> dict[str, str] | None:
    return await sandbox.agent_changes() if isinstance(sandbox, ListsChanges) else None


async def keep(sandbox: Sandbox) -> dict[str, str]:
    if not isinstance(sandbox, Keeps):
        raise SandboxError(f"the {sandbox.backend} backend cannot keep a sandbox after the trial")
    return await sandbox.keep()


async def set_network(sandbox: Sandbox, enabled: bool) -> str | None:
    if isinstance(sandbox, SwitchesNetwork):
        return await sandbox.set_network(enabled)
    return fixed_network(sandbox, enabled)


def fixed_network(sandbox: Sandbox, enabled: bool) -> str | None:
    """``set_network`` where the network chosen at creation (``spec.network``) stays."""
    if enabled == sandbox.spec.network:
        return None
    return f"the {sandbox.backend} backend cannot change a running sandbox's network"


def host_files(sandbox: Sandbox) -> HostFiles | None:
    return sandbox.host_files() if isinstance(sandbox, ReachesFiles) else None
