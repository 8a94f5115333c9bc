"""The sandbox contract: what a backend implements, in one screen.

A sandbox is one isolated machine for one trial, used with ``async with``. A backend subclasses
``Sandbox`` and implements nine coroutines, the first five required:
- ``start()``: create it and prepare the task's environment (``env``, ``workdir``, ``image`` set).
- ``stop()``: remove everything; idempotent; runs on every path out of ``async with``.
- ``run(command)``: a ``Command`` to completion; callers write ``exec(argv, timeout=...)``.
- ``open_process(argv, env=, cwd=, user=)``: a long-lived process with byte streams (the shell).
- ``kill_agent_processes()``: every process started since ``start`` is gone; files stay.
- ``upload_tar`` / ``download_tar``: files as tar archives; by default through ``run``
  (``upload_tar_by_exec``, ``download_tar_by_exec``), overridden where a backend has a native path.
- ``check_alive()``, ``limit_warnings()``: health reports; by default "cannot tell" and none.
Data a backend sets: ``backend``, ``supports_users`` (``Command.user`` works), ``default_user``,
``paces_own_creation``, ``untraced_loads``, ``node_name``. Optional abilities (tracing, the agent's changes, keep, the
network between phases, host-side file access) are the protocols of ``termgym.sandboxes.capabilities``,
whose functions answer "cannot" for a sandbox without them; host-side tar helpers
(``tar_of_files``, ``upload_files``) are in ``termgym.sandboxes.files``.
Guarantees callers rely on: every command runs inside the sandbox, never on the host; ``run``
never raises for the command's own failure or timeout (that is data in ``ExecResult``) and raises
``SandboxError`` only for infrastructure faults (``SandboxBroken`` when the sandbox broke inside)."""

from __future__ import annotations

import abc
import base64
import binascii
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from termgym.aio import run_to_end
from termgym.errors import SandboxBroken, SandboxError
from termgym.output import DEFAULT_OUTPUT_LIMIT

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ROOT = "0"  # Command.user for the sandbox's root, whatever the image's USER: every backend accepts it
# The agent's persistent shell (``termgym.episode.persistent_shell``): what it runs and, with the
# sandbox's own environment on top (``agent_env``), the environment it runs with. Here, so that a
# backend may start it ahead of the episode (the embedded warm pool does).
AGENT_SHELL = ("/bin/bash", "--noprofile", "--norc")
AGENT_SHELL_ENV = {"HOME": "/root", "LANG": "C.UTF-8", "TERM": "dumb"}


def agent_env(sandbox_env: Mapping[str, str]) -> dict[str, str]:
    """The environment the agent's commands run with: a home, a locale and a dumb terminal, under
    the sandbox's own."""
    return {**AGENT_SHELL_ENV, **sandbox_env}


@dataclass(frozen=True)
class Resources:
    """What the sandbox gets: ``cpus`` > 0, ``memory_mb`` and ``storage_mb`` >= 1."""

    cpus: float = 1.0
    memory_mb: int = 2048
    storage_mb: int = 10240


@dataclass(frozen=True)
class SandboxSpec:
    """What a backend needs to build one sandbox for a task's environment."""

    name: str
    context_dir: Path | None
    dockerfile: Path | None
    image: str | None = None
    resources: Resources = field(default_factory=Resources)
    network: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    build_timeout_sec: float = 600.0
    compose_file: Path | None = None
    image_aliases: Mapping[str, str] = field(default_factory=dict)  # FROM rewrites for offline builds
    pull: str = "missing"  # images from a registry: "missing" (as docker run), "never", "always"
    prefer_build: bool = False  # build the Dockerfile even when the task names a docker_image (--build)


@dataclass(frozen=True)
class Command:
    """One command to run to completion (``Sandbox.run``): ``env`` replaces the environment entirely
    (None: the sandbox's own ``env``); ``cwd`` None is the sandbox's ``workdir``; ``output_limit``
    caps the captured output (head and tail kept); ``user`` is a name or a numeric uid, ``uid:gid``
    too (None: the sandbox's ``default_user``, as ``docker exec`` runs the image's USER; ``ROOT``:
    its root on every backend), and ``SandboxError`` where the backend cannot (``supports_users``
    False, for any other user) or the user is unknown."""

    argv: Sequence[str]
    timeout: float
    stdin: bytes | None = None
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    output_limit: int = DEFAULT_OUTPUT_LIMIT
    user: str | None = None


@dataclass(frozen=True)
class ExecResult:
    exit_code: int | None  # None when the command was killed for its timeout; 128 + N when signal N ended it
    output: bytes  # stdout and stderr interleaved, capped (head and tail)
    timed_out: bool = False
    dropped_bytes: int = 0
    trace: bytes | None = None  # exec_traced: the tracer's stream, apart from the output
    trace_dropped: int = 0  # bytes of it the capture dropped (the trace is then incomplete)

    @property
    def text(self) -> str:
        return self.output.decode("utf-8", errors="replace")


class ProcessChannel(abc.ABC):
    """A running process inside the sandbox: stdin in, stdout (with stderr) out."""

    @abc.abstractmethod
    async def write(self, data: bytes) -> None: ...

    async def write_expecting(self, data: bytes, end: bytes) -> None:
        """``write``, saying that the reader next waits for output that contains ``end``. A channel
        that relays output over a network may hold the output back until then (briefly, and bounded)
        to send it in one piece; every byte still comes, in order. By default, a plain ``write``."""
        await self.write(data)

    @abc.abstractmethod
    async def read(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes``; ``b""`` once the process's output is closed."""

    @abc.abstractmethod
    async def wait(self) -> int | None:
        """Wait until the process has exited; its exit status if known."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stop the process (if running) and release the channel; idempotent."""


class Sandbox(abc.ABC):
    """One isolated machine for one trial (the module docstring is the contract)."""

    backend: str = "?"
    # True when the backend paces every create attempt (retries included) against its provider's
    # quota itself, as Daytona does; a scheduler then adds no pacing of its own in front of it.
    paces_own_creation: bool = False
    # True when Command.user (and open_process's user) may name another user than the sandbox's root.
    supports_users: bool = False
    # What runs from the sandbox's own files outside the tracer's sight (Docker: each restart's
    # keeper and entrypoint, the tracer's loader's preload list): a change to one is a forged load.
    untraced_loads: tuple[str, ...] = ()
    # The cluster node the sandbox runs on (--cluster: termgym.sandboxes.ray); '' on this machine.
    node_name: str = ""
    # Who runs a Command whose user is None, set by start(): the image's USER as the backend honours
    # it (Docker; the embedded backend as root), '' where that is the sandbox's root (runs_as_root).
    default_user: str = ""

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        # Set by start(): the environment and working directory the task's image defines.
        self.env: dict[str, str] = {"PATH": DEFAULT_PATH}
        self.workdir: str = "/"
        self.warnings: list[str] = []
        # Set by start(): the image the sandbox runs (ref, source "docker_image"/"build"/"host", digest).
        self.image: dict[str, str] = {}

    @abc.abstractmethod
    async def start(self) -> None: ...

    @abc.abstractmethod
    async def stop(self) -> None: ...

    @abc.abstractmethod
    async def run(self, command: Command) -> ExecResult:
        """Run ``command`` to completion (callers write ``exec``)."""

    @abc.abstractmethod
    async def open_process(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, user: str | None = None
    ) -> ProcessChannel:
        """A long-lived process (the persistent shell); ``user`` as ``Command.user``."""

    @abc.abstractmethod
    async def kill_agent_processes(self) -> None:
        """Kill every process started in the sandbox since ``start``; files stay as they are."""

    async def upload_tar(self, archive: bytes, dest: str, *, timeout: float = 120.0) -> None:
        """Unpack a tar archive into directory ``dest`` (created if missing)."""
        await upload_tar_by_exec(self, archive, dest, timeout=timeout)

    async def download_tar(self, paths: Sequence[str], *, limit: int, timeout: float = 120.0) -> bytes:
        """A tar archive of those of the absolute ``paths`` that exist, named relative to ``/``
        (empty when none does); ``SandboxBroken`` when it is over ``limit`` bytes or unreadable.
        What it holds is untrusted (``termgym.episode.artifacts.safe_artifacts``)."""
        return await download_tar_by_exec(self, paths, limit=limit, timeout=timeout)

    async def check_alive(self) -> None:
        """``SandboxBroken`` if the sandbox's own processes all ended (killed from inside),
        ``SandboxGone`` if it was removed; the default cannot tell and returns."""
        return None

    async def limit_warnings(self) -> list[str]:
        """One line per resource limit the sandbox reached so far (memory, processes, storage)."""
        return []

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        user: str | None = None,
    ) -> ExecResult:
        """``run`` of the ``Command`` these fields make (not for a backend to override)."""
        return await self.run(Command(tuple(argv), timeout, stdin, env, cwd, output_limit, user))

    async def __aenter__(self) -> Sandbox:
        try:
            await self.start()
        except BaseException:
            await run_to_end(self.stop())
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await run_to_end(self.stop())


@dataclass(frozen=True)
class BackendHooks:
    """What a backend's module may offer besides its ``Sandbox`` class, as its ``HOOKS`` (every hook
    optional: a backend written from CONTRIBUTING.md with none of them works). ``preflight()``
    raises ``BackendUnavailable`` in one line when this machine cannot run the backend;
    ``remove_leftovers(images)`` is ``termgym gc`` (one line saying what went); ``close_shared()``
    closes what the backend's sandboxes share (HTTP clients, a warm pool) at the end of a run;
    ``attach(id)`` enters a sandbox an earlier ``--keep`` left running; ``prewarm(specs, count)``
    and ``warm_pool_on()`` are a warm pool's (Docker's)."""

    preflight: Callable[[], None] | None = None
    remove_leftovers: Callable[[bool], Awaitable[str]] | None = None
    close_shared: Callable[[], Awaitable[None]] | None = None
    attach: Callable[[str], Awaitable[Sandbox]] | None = None
    prewarm: Callable[[Sequence[SandboxSpec], int | None], Awaitable[int]] | None = None
    warm_pool_on: Callable[[], bool] | None = None


def runs_as_root(user: str) -> bool:
    """Whether ``user`` (a ``USER``, ``default_user``) is the sandbox's root, whatever its group."""
    return user.partition(":")[0] in ("", "root", "0")


def refuse_user(sandbox: Sandbox, user: str | None) -> None:
    """``SandboxError`` for a ``user`` (not None nor ``ROOT``) where ``sandbox`` runs everything as its root."""
    if user is not None and user != ROOT:
        raise SandboxError(f"the {sandbox.backend} backend cannot run a command as user {user}")


async def upload_tar_by_exec(sandbox: Sandbox, archive: bytes, dest: str, *, timeout: float = 120.0) -> None:
    """``Sandbox.upload_tar`` through the sandbox's own ``tar`` reading the archive on its stdin."""
    script = 'mkdir -p "$1" && exec tar -x --no-same-owner -C "$1" -f -'
    result = await sandbox.exec(["/bin/sh", "-c", script, "sh", dest], stdin=archive, timeout=timeout, cwd="/")
    if result.exit_code != 0:
        raise SandboxBroken(f"upload to {dest} failed: {last_line(result.text)}")


async def download_tar_by_exec(sandbox: Sandbox, paths: Sequence[str], *, limit: int, timeout: float = 120.0) -> bytes:
    """``Sandbox.download_tar`` through the sandbox's own ``tar`` (found on the system directories
    only), cut at ``limit + 1`` bytes as it streams, so a tree that claims more (a sparse file of
    terabytes) stops the read there."""
    script = (
        f"PATH={DEFAULT_PATH}\n"
        'cap=$1; shift\nfor p; do shift; if [ -e "/$p" ] || [ -L "/$p" ]; then set -- "$@" "$p"; fi; done\n'
        '[ "$#" -gt 0 ] || exit 0\ntar -C / -cf - -- "$@" 2>/dev/null | head -c "$cap" | base64 -w 0'
    )
    relative = [path.strip("/") for path in paths]
    result = await sandbox.exec(
        ["/bin/sh", "-c", script, "sh", str(limit + 1), *relative],
        timeout=timeout,
        cwd="/",
        env={"PATH": DEFAULT_PATH},
        output_limit=base64_length(limit + 1) + 8,
    )
    try:
        archive = base64.b64decode(result.output, validate=True) if result.exit_code == 0 else None
    except (binascii.Error, ValueError) as exc:
        raise SandboxBroken(f"could not read {', '.join(paths)}: the archive came back garbled") from exc
    if archive is None or result.dropped_bytes or len(archive) > limit:
        why = f"over {limit >> 20} MB" if archive is not None else f"tar failed: {last_line(result.text)}"
        raise SandboxBroken(f"could not read {', '.join(paths)} ({why})")
    return archive


def base64_length(size: int, *, line: int | None = None) -> int:
    """How long ``base64``'s output is for ``size`` bytes: 4 characters per 3 bytes, padded; with
    ``line`` (the tool's default is 76; ``-w 0`` is None), a newline ending each line of at most
    ``line`` characters."""
    encoded = (size + 2) // 3 * 4
    return encoded if line is None else encoded + -(-encoded // line)


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank, cut at 300 characters (``no output`` when none is)."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"
