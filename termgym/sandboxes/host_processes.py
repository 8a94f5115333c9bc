"""The embedded backend's host processes: spawning them with only ``HOST_ENV`` (never interrupted
half-way by a cancellation), feeding and draining their pipes into a bounded capture, the channel
a persistent shell runs over, and ending process trees (a new session's, a bwrap keeper's); and a
keeper detached from this process (``--keep``), which outlives it and is ended by pid.

Guaranteed: ``spawn`` either returns the started process or, when cancelled, leaves none behind;
``end_entered`` and ``end_keeper`` return once every process they end is gone and reaped;
``end_detached`` signals a pid only while its start time still matches (never a reused pid).
Waiting for a process's end is event-driven (``HostProcess.exited``, set when the event loop
learns of the exit, before its pipes close), never a polling loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from termgym.aio import cancel_and_wait, uninterrupted, wait_for
from termgym.errors import SandboxError
from termgym.output import OutputCapture
from termgym.sandboxes.base import ProcessChannel
from termgym.sandboxes.tools import host_tool

HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
POLL_SEC = 0.001  # how often a wait for a condition without an event (a cgroup emptied) looks again


class _ExitProtocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's stream protocol, and a future set as soon as the process has exited: on Python
    3.11 ``Process.wait()`` also waits for every pipe to close, which a background job holding
    the output pipe can delay for ever."""

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


class HostProcess(asyncio.subprocess.Process):
    """An ``asyncio.subprocess.Process`` whose ``exited`` future is done once it has exited (its
    ``returncode`` set), whatever its pipes still hold."""

    def __init__(self, transport: Any, protocol: _ExitProtocol, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(transport, protocol, loop)
        self.exited = protocol.exited


class _PidfdWatcher(asyncio.AbstractChildWatcher):
    """Python 3.12's default child watcher, for 3.11: a process's end is a readable pidfd on the
    loop that started it, any loop in any thread. 3.11's default (``ThreadedChildWatcher``) holds a
    thread per live child, and every thread lengthens the kernel's walk over all tasks in each
    new sandbox's ``pivot_root``: three a live embedded sandbox."""

    def add_child_handler(self, pid: int, callback: Callable[..., object], *args: Any) -> None:
        loop = asyncio.get_running_loop()
        pidfd = os.pidfd_open(pid)
        loop.add_reader(pidfd, self._reap, loop, pid, pidfd, callback, args)

    @staticmethod
    def _reap(
        loop: asyncio.AbstractEventLoop, pid: int, pidfd: int, callback: Callable[..., object], args: tuple
    ) -> None:
        loop.remove_reader(pidfd)
        os.close(pidfd)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped by someone else: asyncio's own answer for that
            code = 255
        else:
            code = os.waitstatus_to_exitcode(status)
        callback(pid, code, *args)

    def remove_child_handler(self, pid: int) -> bool:
        return True  # asyncio never calls it

    def attach_loop(self, loop: asyncio.AbstractEventLoop | None) -> None:
        pass

    def close(self) -> None:
        pass

    def is_active(self) -> bool:
        return True

    def __enter__(self) -> _PidfdWatcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        pass


def _watch_children_with_pidfds() -> None:
    """On Python 3.11 with the default policy and its default watcher, watch children as 3.12 does
    (``_PidfdWatcher``); a watcher or policy someone chose, a later Python, or a kernel without
    pidfds is left as it is. Children the old watcher already watches stay its own."""
    global _watcher_checked
    if _watcher_checked:
        return
    _watcher_checked = True
    if sys.version_info >= (3, 12) or type(asyncio.get_event_loop_policy()) is not asyncio.DefaultEventLoopPolicy:
        return
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return
    if type(asyncio.get_child_watcher()) is asyncio.ThreadedChildWatcher:
        asyncio.set_child_watcher(_PidfdWatcher())


_watcher_checked = False


async def _exec(argv: Sequence[str], **kwargs: Any) -> HostProcess:
    """``asyncio.create_subprocess_exec``, as a ``HostProcess``."""
    _watch_children_with_pidfds()
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(lambda: _ExitProtocol(limit=2**16, loop=loop), *argv, **kwargs)
    return HostProcess(transport, protocol, loop)


async def exited(process: asyncio.subprocess.Process, timeout: float | None = None) -> bool:
    """Wait until ``process`` has exited (at most ``timeout`` seconds); whether it has."""
    if process.returncode is not None:
        return True
    ended = getattr(process, "exited", None)
    if ended is None:  # not one of ``spawn``'s: its end is seen by looking again
        deadline = None if timeout is None else time.monotonic() + timeout
        while process.returncode is None and (deadline is None or time.monotonic() < deadline):
            await asyncio.sleep(POLL_SEC)
        return process.returncode is not None
    await asyncio.wait({ended}, timeout=timeout)
    return process.returncode is not None


class HostChannel(ProcessChannel):
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
        """The process's exit status once it has exited, whatever still holds its output open (a
        background job it started): not ``Process.wait()``, which on Python 3.11 waits for that too."""
        await exited(self._process)
        return self._process.returncode

    @property
    def running(self) -> bool:
        """Not closed, and its process has not exited."""
        return not self.closed and self._process.returncode is None

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await end_entered(self._process)


async def communicate(
    process: asyncio.subprocess.Process,
    stdin: bytes | None,
    capture: OutputCapture,
    errors: OutputCapture | None = None,
) -> None:
    """Feed ``stdin`` and drain stdout into ``capture`` (and stderr into ``errors``, when the process
    has a stderr pipe of its own) until the output ends or the process has exited."""

    async def feed() -> None:
        assert process.stdin is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            process.stdin.write(stdin or b"")
            await process.stdin.drain()
        process.stdin.close()

    async def drain(stream: asyncio.StreamReader | None, into: OutputCapture) -> None:
        assert stream is not None
        while chunk := await stream.read(65536):
            into.feed(chunk)

    feeder = asyncio.create_task(feed()) if stdin is not None else None
    reader = asyncio.create_task(drain(process.stdout, capture))
    if errors is not None:  # both pipes to their end: the output's end waits for the trace's too
        reader = asyncio.create_task(_both(reader, asyncio.create_task(drain(process.stderr, errors))))
    ending = asyncio.ensure_future(exited(process))
    try:
        # Output ends at EOF, or shortly after the process exits when a daemon it started still
        # holds the pipe open.
        await asyncio.wait({reader, ending}, return_when=asyncio.FIRST_COMPLETED)
        if not reader.done():
            await asyncio.wait({reader}, timeout=0.1)
    finally:
        await cancel_and_wait(ending)
        await cancel_and_wait(reader, feeder)


async def _both(first: asyncio.Task[None], second: asyncio.Task[None]) -> None:
    try:
        await asyncio.gather(first, second)
    finally:
        await cancel_and_wait(first, second)


async def spawn(
    argv: Sequence[str], end: Callable[[asyncio.subprocess.Process], Awaitable[None]], **kwargs: Any
) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec`` with ``HOST_ENV`` as its whole environment, which a
    cancellation never interrupts half-way (see ``termgym.aio``): if the caller is cancelled
    meanwhile, the process is started, ended with ``end`` and released, and the cancellation
    propagates."""
    spawning = _exec(argv, env=HOST_ENV, **kwargs)
    return await uninterrupted(spawning, end)


async def end_entered(process: asyncio.subprocess.Process) -> None:
    """End a command started with ``nsenter`` in a new session, and everything it started."""
    if process.returncode is None:
        kill_tree(process.pid)
    await release(process)


async def end_keeper(keeper: asyncio.subprocess.Process) -> None:
    """End a sandbox: killing the namespace's init makes the kernel kill every process in it. Only
    while its bubblewrap is unreaped (no return code: the watcher sets it as it reaps, on this
    loop): once reaped, its pid may be another process's, whose children (another sandbox's
    namespace) are not this one's to kill; its own namespace ended with it (``--die-with-parent``)."""
    if keeper.returncode is None:
        for pid in children(keeper.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    await end_process(keeper)


async def end_process(process: asyncio.subprocess.Process) -> None:
    """SIGKILL ``process`` if it still runs (not what it forked), then ``release`` it."""
    if process.returncode is None:
        # os.kill, not Process.kill: that polls first and may reap the exited process behind
        # the child watcher's back (which then warns "Unknown child process").
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    await release(process)


async def release(process: asyncio.subprocess.Process, timeout: float = 5.0) -> None:
    """Wait until the process has exited, then close its pipes.

    Not ``process.wait()``: on Python 3.11 that also waits for every pipe to close, which a
    background job holding the output pipe can delay for ever. Nor closing the transport before the
    exit is known: that reaps the process behind the child watcher's back."""
    await exited(process, timeout)
    transport = getattr(process, "_transport", None)
    if transport is not None:
        transport.close()


def kill_tree(pid: int) -> None:
    """SIGKILL a host process started with a new session, and every process it forked into the
    sandbox (nsenter does not forward signals to its child)."""
    for child in children(pid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def children(pid: int) -> list[int]:
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    children: list[int] = []
    for task in tasks:
        with contextlib.suppress(OSError):
            children += [int(p) for p in Path(f"/proc/{pid}/task/{task}/children").read_text().split()]
    return children


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children first, then theirs), as /proc lists them now."""
    found, queue = [], [pid]
    while queue:
        for child in children(queue.pop()):
            found.append(child)
            queue.append(child)
    return found


SIGKILL_BIT = 1 << (9 - 1)  # SIGKILL in /proc/<pid>/status's pending-signal masks
PF_EXITING = 0x4  # the kernel's "process is exiting" flag, field 9 of /proc/<pid>/stat


def alive(pid: int) -> bool:
    """True while ``pid`` runs and is not already dying: a process sent SIGKILL (pending, even if
    it has not run since), exiting, a zombie or reaped is not alive. The pending mask is read
    before the state, so a kill that another process's ``kill`` call has returned from is always
    seen, however loaded the machine (the signal is pending, or dequeued and the process exiting)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & SIGKILL_BIT:
            return False
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[0] not in ("Z", "X") and not int(fields[6]) & PF_EXITING


def close_output_pipes(process: asyncio.subprocess.Process) -> None:
    """Close this process's ends of ``process``'s stdout and stderr pipes, once nothing more is
    read from them (a keeper that said ``ready``): each live sandbox then holds two descriptors
    fewer here, and every process this one forks copies, then closes, every descriptor it holds
    (``dup_fd``, ``close_range``: a cost that grows with the sandboxes alive)."""
    transport = getattr(process, "_transport", None)
    for fd in (1, 2):
        pipe = transport.get_pipe_transport(fd) if transport is not None else None
        if pipe is not None:
            pipe.close()


async def read_stderr(process: asyncio.subprocess.Process) -> str:
    with contextlib.suppress(Exception):
        assert process.stderr is not None
        return (await wait_for(process.stderr.read(), 1.0)).decode(errors="replace")
    return ""


# -- detached keepers (--keep): not this process's children, ended by pid and start time ------------

# Starts "$@" in the background in a session of its own (setsid execs in place: a background job of
# a non-interactive shell leads no process group), its stderr to the log, and prints its pid.
_DETACH = 'log=$1; shift; "$SETSID" "$@" </dev/null 2>>"$log" & echo "pid $!"'


def start_detached(argv: Sequence[str], *, log: Path, timeout: float) -> int:
    """Start ``argv`` (whose every wrapper execs in place) so that it outlives this process: its
    parent, a shell, exits at once, it is in a session of its own and no death signal is tied to
    this process. Returns its pid once it printed ``ready``; ``SandboxError`` with the last line of
    its stderr (appended to ``log``) when it did not within ``timeout``. Blocking."""
    env = {**HOST_ENV, "SETSID": host_tool("setsid")}
    shell = subprocess.Popen(
        [host_tool("sh"), "-c", _DETACH, "sh", str(log), *argv],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    assert shell.stdout is not None
    pid: int | None = None
    ready = False
    buffer = b""
    deadline = time.monotonic() + timeout
    try:
        while not (ready and pid is not None):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([shell.stdout], [], [], left)[0]:
                break
            chunk = os.read(shell.stdout.fileno(), 4096)
            if not chunk:
                break  # every writer is gone: the program exited
            buffer += chunk
            *lines, rest = buffer.split(b"\n")
            buffer = rest
            for line in lines:
                if line.startswith(b"pid "):
                    pid = int(line[4:])
                ready = ready or line == b"ready"
    finally:
        shell.stdout.close()
        shell.wait()
    if pid is not None and ready:
        return pid
    if pid is not None:
        end_detached(pid, start_time(pid))
    why = (log.read_text(errors="replace").strip().splitlines() or ["it did not say ready"])[-1] if log.exists() else ""
    raise SandboxError(f"bubblewrap failed to start a kept sandbox: {why or 'it did not say ready'}")


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot, /proc/PID/stat field 22); None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat[stat.rfind(")") + 2 :].split()[19])
    except (IndexError, ValueError):
        return None


def same_process(pid: int, started: int | None) -> bool:
    """True while ``pid`` runs and is the process that started at ``started``."""
    return started is not None and alive(pid) and start_time(pid) == started


def end_detached(pid: int, started: int | None, timeout: float = 5.0) -> bool:
    """End a detached keeper: SIGKILL its children (the namespace's init, so the kernel ends every
    process in it) and itself, if ``pid`` is still the process that started at ``started``; waits
    until it is gone. False when it was not running (or is another process now). Blocking."""
    if not same_process(pid, started):
        return False
    for child in children(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(POLL_SEC)
    return True
