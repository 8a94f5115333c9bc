"""The embedded backend: a bubblewrap sandbox on this machine, no daemon, no image, no network.

What it covers: the host's ``/usr`` and ``/etc`` read-only; private writable directories for
``/app``, ``/tmp``, ``/root``, ``/home``, ``/opt``, ``/var``, ``/logs``, ``/tests``,
``/solution`` and every other top-level path the task's Dockerfile uses; fresh PID, network, IPC
and UTS namespaces (no network at all, only a private loopback); user namespace (root inside is not
root outside). The sandbox is one long-lived namespace "keeper" process started with
``--die-with-parent``: when the termgym process dies, for whatever reason, the kernel kills every
process in the sandbox. Every command enters the keeper's namespaces with ``nsenter``.

Killing the agent's processes restarts the keeper: the kernel kills every process of a PID
namespace when its first process dies, so nothing survives, whatever it forked or however it
detached. The files stay, since they live in host directories.

What it does not cover: CPU, memory, process-count and disk limits are not enforced (use
``--backend docker``); the environment is prepared by running the Dockerfile's ``WORKDIR``,
``ENV``, ``COPY``/``ADD`` and ``RUN`` steps against the host's tools, so a ``RUN`` that needs
packages the host lacks fails and says to use ``--backend docker``; ``FROM`` is ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

from termgym.aio import cancel_and_wait, uninterrupted, wait_for
from termgym.dockerfile import DockerfileError, EnvironmentPlan, parse_dockerfile
from termgym.errors import BackendUnavailable, EnvironmentBuildError, SandboxError
from termgym.output import DEFAULT_OUTPUT_LIMIT, OutputCapture
from termgym.sandboxes.base import ExecResult, ProcessChannel, Sandbox, SandboxSpec
from termgym.sandboxes.prepare import prepare_environment

BASE_WRITABLE = ("app", "tmp", "root", "home", "opt", "srv", "mnt", "var", "run", "logs", "tests", "solution")
HOST_READONLY = ("usr", "etc", "bin", "lib", "lib64", "sbin", "proc", "dev", "sys")
KEEPER_START_TIMEOUT = 10.0
# The whole environment of bwrap and nsenter: nothing of this process's environment follows them into
# the sandbox (an LD_PRELOAD of a host library, as vLLM's import sets, breaks the loader in there).
HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}


def sandbox_root_dir() -> Path:
    """Where sandbox directories live on the host (``TERMGYM_SANDBOX_DIR`` or ``$TMPDIR/termgym``)."""
    return Path(os.environ.get("TERMGYM_SANDBOX_DIR") or Path(tempfile.gettempdir()) / "termgym")


def require_tools() -> None:
    if shutil.which("bwrap") is None or shutil.which("nsenter") is None:
        raise BackendUnavailable("the embedded backend needs bubblewrap and nsenter: apt-get install bubblewrap util-linux")


def writable_roots(plan: EnvironmentPlan | None) -> list[str]:
    """Top-level directories that get a private writable host directory: the fixed set plus every
    top-level path the Dockerfile works in or copies to (``/workspace``, ``/srv``...)."""
    roots = list(BASE_WRITABLE)
    paths: list[str] = []
    if plan is not None:
        paths.append(plan.workdir)
        for step in plan.steps:
            paths.append(getattr(step, "dest", None) or getattr(step, "path", None) or step.workdir)
    for path in paths:
        top = path.strip("/").split("/", 1)[0]
        if top and top not in roots and top not in HOST_READONLY:
            roots.append(top)
    return roots


class LocalSandbox(Sandbox):
    backend = "local"

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec)
        self._dir: Path | None = None
        self._roots: list[str] = list(BASE_WRITABLE)
        self._keeper: asyncio.subprocess.Process | None = None
        self._keeper_pid: int | None = None  # host pid of the namespace's first process
        self._channels: list[_LocalChannel] = []

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        require_tools()
        plan = self._plan()
        self._roots = writable_roots(plan)
        root = sandbox_root_dir()
        root.mkdir(parents=True, exist_ok=True)
        self._dir = Path(tempfile.mkdtemp(prefix=f"tg-{_slug(self.spec.name)}-", dir=root))
        for name in self._roots:
            (self._dir / "fs" / name).mkdir(parents=True)
        (self._dir / "fs" / "var" / "tmp").mkdir()
        labels = {"termgym": "1", **dict(self.spec.labels), "termgym.task": self.spec.name}
        (self._dir / "labels.json").write_text(json.dumps(labels))
        if self.spec.network:
            self.warnings.append("the task asks for network; the embedded backend has none (use --backend docker)")
        await self._start_keeper()
        self.env = {**self.env, **dict(self.spec.env)}
        if plan is not None:
            if plan.user not in (None, "root", "0"):
                self.warnings.append(f"USER {plan.user} ignored: the embedded backend runs as root")
            await prepare_environment(self, plan, self.spec)

    async def stop(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        await self._stop_keeper()
        if self._dir is not None:
            await asyncio.to_thread(shutil.rmtree, self._dir, True)
            self._dir = None

    async def kill_agent_processes(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        await self._stop_keeper()
        await self._start_keeper()

    def _plan(self) -> EnvironmentPlan | None:
        if self.spec.dockerfile is None:
            if self.spec.image:
                self.warnings.append(f"image {self.spec.image} is not used by the embedded backend")
            return None
        try:
            return parse_dockerfile(self.spec.dockerfile.read_text(encoding="utf-8", errors="replace"))
        except DockerfileError as exc:
            raise EnvironmentBuildError(f"{self.spec.dockerfile}: {exc}") from exc

    # -- the keeper: the process whose namespaces every command enters --------------------------

    def _bwrap_argv(self) -> list[str]:
        assert self._dir is not None
        argv = [
            "bwrap", "--unshare-all", "--unshare-user", "--uid", "0", "--gid", "0",
            "--hostname", "termgym", "--die-with-parent", "--new-session",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
            "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib",
            "--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin",
            "--proc", "/proc", "--dev", "/dev",
        ]  # fmt: skip
        for name in self._roots:
            argv += ["--bind", str(self._dir / "fs" / name), f"/{name}"]
        # The keeper says "ready" once the sandbox is fully set up; commands enter its namespaces.
        argv += ["--chdir", "/", "--clearenv", "--", "/bin/sh", "-c", "echo ready; exec /bin/sleep infinity"]
        return argv

    async def _start_keeper(self) -> None:
        self._keeper = await _spawn(
            self._bwrap_argv(),
            _end_keeper,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        assert self._keeper.stdout is not None and self._keeper.stderr is not None
        try:
            line = await wait_for(self._keeper.stdout.readline(), KEEPER_START_TIMEOUT)
            if line != b"ready\n":
                raise ValueError("the keeper did not start")
            # bwrap (host) -> the namespace's init -> the keeper command: enter the keeper's.
            (init,) = _children(self._keeper.pid)
            (keeper,) = _children(init)
            self._keeper_pid = keeper
        except (TimeoutError, ValueError) as exc:
            keeper = self._keeper
            await self._stop_keeper()
            stderr = (await _read_stderr(keeper)).strip() or str(exc)
            raise SandboxError(f"bubblewrap failed to start a sandbox: {stderr}") from exc
        if self._dir is not None:
            (self._dir / "keeper.pid").write_text(str(self._keeper.pid))

    async def _stop_keeper(self) -> None:
        if self._keeper is None:
            return
        await _end_keeper(self._keeper)
        self._keeper_pid = None
        self._keeper = None

    def _enter_argv(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> list[str]:
        if self._keeper_pid is None:
            raise SandboxError("the sandbox is not running")
        pairs = [f"{key}={value}" for key, value in env.items()]
        return [
            "nsenter", "-t", str(self._keeper_pid), "-U", "-m", "-p", "-n", "-i", "-u", "-r", "-w",
            "--preserve-credentials", "--", "/usr/bin/env", "-i", "-C", cwd, *pairs, *argv,
        ]  # fmt: skip

    # -- commands ----------------------------------------------------------------------------------

    async def exec(
        self,
        argv: Sequence[str],
        *,
        timeout: float,
        stdin: bytes | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        # `timeout` inside the sandbox kills the command's whole process group (TERM, then KILL
        # one second later); the host-side deadline is only a backstop if that fails.
        limit = max(timeout, 0.001)
        inner = ["/usr/bin/timeout", "-k", "1", f"{limit:.3f}", *argv]
        command = self._enter_argv(inner, self.env if env is None else env, cwd or self.workdir)
        process = await _spawn(
            command,
            _end_entered,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        capture = OutputCapture(output_limit)
        started = time.monotonic()
        try:
            await wait_for(_communicate(process, stdin, capture), limit + 5.0)
        except TimeoutError:
            pass  # the in-sandbox timeout failed to end it: killed below
        finally:
            await _end_entered(process)
        code = process.returncode
        if self._keeper_pid is None or not _alive(self._keeper_pid):
            raise SandboxError("the sandbox died while a command was running")
        timed_out = code in (124, 137, -9) and time.monotonic() - started >= limit
        return ExecResult(
            exit_code=None if timed_out else code,
            output=capture.getvalue(),
            timed_out=timed_out,
            dropped_bytes=capture.dropped_bytes,
        )

    async def open_process(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str) -> ProcessChannel:
        process = await _spawn(
            self._enter_argv(argv, env, cwd),
            _end_entered,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        channel = _LocalChannel(process)
        self._channels = [c for c in self._channels if not c.closed] + [channel]
        return channel

    @property
    def host_dir(self) -> Path | None:
        """The host directory holding the sandbox's writable file systems (for tests and gc)."""
        return self._dir


class _LocalChannel(ProcessChannel):
    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self._process = process
        self.closed = False

    async def write(self, data: bytes) -> None:
        assert self._process.stdin is not None
        try:
            self._process.stdin.write(data)
            await self._process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise SandboxError("the shell's input is closed") from exc

    async def read(self, max_bytes: int) -> bytes:
        assert self._process.stdout is not None
        return await self._process.stdout.read(max_bytes)

    async def wait(self) -> int | None:
        return await self._process.wait()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await _end_entered(self._process)


async def _communicate(process: asyncio.subprocess.Process, stdin: bytes | None, capture: OutputCapture) -> None:
    async def feed() -> None:
        assert process.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            process.stdin.write(stdin or b"")
            await process.stdin.drain()
        process.stdin.close()

    async def drain() -> None:
        assert process.stdout is not None
        while chunk := await process.stdout.read(65536):
            capture.feed(chunk)

    feeder = asyncio.create_task(feed()) if stdin is not None else None
    reader = asyncio.create_task(drain())
    try:
        # Output ends at EOF, or shortly after the process exits when a daemon it started still
        # holds the pipe open.
        while not reader.done() and process.returncode is None:
            await asyncio.wait({reader}, timeout=_POLL_SEC)
        if not reader.done():
            await asyncio.wait({reader}, timeout=0.1)
    finally:
        await cancel_and_wait(reader, feeder)


_POLL_SEC = 0.005


async def _spawn(
    argv: Sequence[str], end: Callable[[asyncio.subprocess.Process], Awaitable[None]], **kwargs: object
) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec`` with ``HOST_ENV`` as its whole environment, which a
    cancellation never interrupts half-way (see ``termgym.aio``): if the caller is cancelled
    meanwhile, the process is started, ended with ``end`` and released, and the cancellation
    propagates."""
    spawning = asyncio.create_subprocess_exec(*argv, env=HOST_ENV, **kwargs)  # type: ignore[arg-type]
    return await uninterrupted(spawning, end)


async def _end_entered(process: asyncio.subprocess.Process) -> None:
    """End a command started with ``nsenter`` in a new session, and everything it started."""
    if process.returncode is None:
        _kill_tree(process.pid)
    await _release(process)


async def _end_keeper(keeper: asyncio.subprocess.Process) -> None:
    """End a sandbox: killing the namespace's init makes the kernel kill every process in it."""
    for pid in _children(keeper.pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if keeper.returncode is None:
        # os.kill, not Process.kill: that polls first and may reap the exited process behind
        # the child watcher's back (which then warns "Unknown child process").
        with contextlib.suppress(ProcessLookupError):
            os.kill(keeper.pid, signal.SIGKILL)
    await _release(keeper)


async def _release(process: asyncio.subprocess.Process, timeout: float = 5.0) -> None:
    """Wait until the process has exited, then close its pipes.

    Not ``process.wait()``: on Python 3.11 that also waits for every pipe to close, which a
    background job holding the output pipe can delay for ever. Nor closing the transport before the
    exit is known: that reaps the process behind the child watcher's back."""
    deadline = time.monotonic() + timeout
    while process.returncode is None and time.monotonic() < deadline:
        await asyncio.sleep(_POLL_SEC)
    transport = getattr(process, "_transport", None)
    if transport is not None:
        transport.close()


def _kill_tree(pid: int) -> None:
    """SIGKILL a host process started with a new session, and every process it forked into the
    sandbox (nsenter does not forward signals to its child)."""
    for child in _children(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children: list[int] = []
    for task in tasks:
        with contextlib.suppress(OSError):
            children += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return children


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _read_stderr(process: asyncio.subprocess.Process) -> str:
    with contextlib.suppress(Exception):
        assert process.stderr is not None
        return (await wait_for(process.stderr.read(), 1.0)).decode(errors="replace")
    return ""


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)[-40:].strip("-") or uuid.uuid4().hex[:8]


def collect_garbage(root: Path | None = None) -> int:
    """Remove sandbox directories whose keeper is gone (left by a run that was killed); a sandbox
    whose keeper still runs belongs to a live run and is kept. Returns how many were removed."""
    removed = 0
    for path in sorted((root or sandbox_root_dir()).glob("tg-*")):
        if not (path / "labels.json").exists():
            continue
        try:
            pid = int((path / "keeper.pid").read_text())
            alive = _alive(pid) and Path(f"/proc/{pid}/comm").read_text().strip() == "bwrap"
        except (OSError, ValueError):
            alive = False
        if not alive:
            shutil.rmtree(path, ignore_errors=True)
            removed += 1
    return removed
