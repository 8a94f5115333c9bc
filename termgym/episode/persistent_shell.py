"""The persistent shell: one long-lived bash per episode, framed with per-command sentinels.

The agent's commands run in the shell process itself, so ``cd``, variables, functions and
background jobs persist from one command to the next, as in a terminal. Output cannot forge the
end of a command: the per-command nonce is read by the shell only after the command has returned.
Guarantees:
- output (stdout and stderr interleaved) is capped, head and tail kept with the number of bytes
  dropped; memory stays bounded; binary and invalid UTF-8 decode to U+FFFD;
- a command that outlives its timeout has its foreground process groups killed and an in-shell
  loop broken by a trapped signal; the result says ``timed_out`` and the shell keeps its state;
- a shell that cannot be brought back is replaced by a new one in the last known directory, and
  the result says ``shell_restarted``;
- ``run(..., interrupt=event)`` stops the command the same way when the event is set (the result
  says ``interrupted``, with the output printed until then);
- a shell that answers anything but a well-formed frame raises ``ShellProtocolError``, and one that
  cannot be started again raises ``SandboxBroken``: never ``ValueError``.
Not guaranteed: commands that read standard input get end-of-file (there is no terminal).

The framing, byte by byte, and its one known leak: docs/guides/tasks.md#the-agents-shell."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

from termgym.aio import cancel_and_wait, wait_for
from termgym.errors import SandboxBroken, SandboxError, ShellProtocolError
from termgym.output import DEFAULT_OUTPUT_LIMIT, OutputCapture
from termgym.sandboxes.base import AGENT_SHELL, ProcessChannel, Sandbox

SENTINEL_FD = 99
INTERRUPT_GRACE_SEC = 3.0
START_TIMEOUT_SEC = 30.0

_BOOTSTRAP = f"""
exec 2>&1 {SENTINEL_FD}>&1
set -m
__tg_in=
trap 'if [ -n "$__tg_in" ]; then return 124; fi' USR1
__tg_exec() {{ eval "$1"; }}
__tg_run() {{
  __tg_in=1
  __tg_exec "$1" </dev/null {SENTINEL_FD}>&-
  __tg_s=$?
  __tg_in=
  IFS= builtin read -r __tg_n
  builtin printf '\\n__TG_%s_ %d %s\\n' "$__tg_n" "$__tg_s" "${{PWD//$'\\n'/\\\\n}}" >&{SENTINEL_FD}
  builtin jobs -p >&{SENTINEL_FD}
  builtin printf '__TG_%s_END\\n' "$__tg_n" >&{SENTINEL_FD}
  __tg_n=
}}
readonly -f __tg_run __tg_exec
builtin printf '\\n__TG_READY_ %d %s\\n__TG_READY_END\\n' "$$" "${{PWD//$'\\n'/\\\\n}}" >&{SENTINEL_FD}
"""

# Kill what the shell runs in the foreground: every descendant of the shell that is not in (or
# under) a background job's process group; whole process groups where they are the command's own.
_INTERRUPT = r"""
S=$1; shift
kill -USR1 "$S" 2>/dev/null  # first, so the shell returns as soon as its foreground dies
for round in 1 2; do
  targets=$(cat /proc/[0-9]*/stat 2>/dev/null | awk -v S="$S" -v keep=" $* " '
    { pid = $1; line = $0; sub(/^.*\) /, "", line); split(line, f, " ")
      ppid[pid] = f[2]; pgid[pid] = f[3]; pids[++n] = pid }
    END {
      changed = 1
      while (changed) {
        changed = 0
        for (i = 1; i <= n; i++) {
          p = pids[i]
          if (p in mine || p == S || index(keep, " " pgid[p] " ")) continue
          if (ppid[p] == S || (ppid[p] in mine)) { mine[p] = 1; changed = 1 }
        }
      }
      for (p in mine) print (pgid[p] == pgid[S] ? p : "-" pgid[p])
    }' | sort -u)
  [ -n "$targets" ] && kill -KILL $targets 2>/dev/null
  sleep 0.05
done
exit 0
"""


@dataclass(frozen=True)
class CommandResult:
    output: str
    exit_code: int | None  # None when the command timed out or the shell died
    timed_out: bool = False
    interrupted: bool = False  # stopped by run()'s interrupt event (exit_code None)
    dropped_bytes: int = 0
    duration: float = 0.0
    cwd: str | None = None
    shell_restarted: bool = False


def bash_quote(command: str) -> str:
    """``command`` as a bash ANSI-C quoted word (``$'...'``) that reproduces its exact bytes."""
    out = []
    for byte in command.encode("utf-8", errors="surrogateescape"):
        if 0x20 <= byte < 0x7F and byte not in (0x27, 0x5C):
            out.append(chr(byte))
        else:
            out.append(f"\\x{byte:02x}")
    return "$'" + "".join(out) + "'"


class _Frame:
    """Scans the shell's output stream for one command's end sentinel."""

    def __init__(self, nonce: str, capture: OutputCapture) -> None:
        self.nonce = nonce
        self.marker = f"\n__TG_{nonce}_ ".encode()
        self.end = f"__TG_{nonce}_END\n".encode()
        self.capture = capture
        self.pending = bytearray()
        self.in_trailer = False
        self.trailer = b""
        self.done = asyncio.get_running_loop().create_future()

    def feed(self, data: bytes) -> None:
        if self.done.done():
            return
        self.pending += data
        if not self.in_trailer:
            index = self.pending.find(self.marker)
            if index < 0:
                keep = len(self.marker) - 1
                if len(self.pending) > keep:
                    self.capture.feed(bytes(self.pending[:-keep]))
                    del self.pending[:-keep]
                return
            self.capture.feed(bytes(self.pending[:index]))
            del self.pending[: index + len(self.marker)]
            self.in_trailer = True
        index = self.pending.find(self.end)
        if index >= 0:
            self.trailer = bytes(self.pending[:index])
            self.done.set_result(None)
        elif len(self.pending) > 1 << 20:  # a trailer is a line and a few pids; never this long
            self.done.set_exception(ShellProtocolError("the shell's end-of-command frame is malformed"))

    def parse_trailer(self) -> tuple[int, str, list[int]]:
        """(status, cwd, background job pids); ``ShellProtocolError`` when the frame is malformed."""
        first, _, rest = self.trailer.decode("utf-8", errors="replace").partition("\n")
        status, _, cwd = first.partition(" ")
        if not status.isdigit() or not all(p.isdigit() for p in rest.split()):
            raise ShellProtocolError(f"the shell answered a malformed end-of-command frame: {first[:80]!r}")
        return int(status), cwd, [int(p) for p in rest.split()]


class PersistentShell:
    """One bash process in a sandbox, stepped a command at a time. Not safe for concurrent ``run``."""

    def __init__(
        self,
        sandbox: Sandbox,
        *,
        env: Mapping[str, str],
        cwd: str,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
        user: str | None = None,  # who the shell runs as (Sandbox.open_process); None: the sandbox's root
    ) -> None:
        self._sandbox = sandbox
        self._user = user
        self._env = dict(env)
        self.cwd = cwd
        self._output_limit = output_limit
        self._channel: ProcessChannel | None = None
        self._reader: asyncio.Task[None] | None = None
        self._exited: asyncio.Task[int | None] | None = None
        self._frame: _Frame | None = None
        self._stray = OutputCapture(output_limit)  # output of background jobs between commands
        self._background_pgids: list[int] = []
        self.pid: int | None = None

    async def start(self) -> None:
        """Start the shell in ``cwd``, or in ``/`` if that directory is gone."""
        try:
            await self._spawn(self.cwd)
        except _ShellExited:
            await self.close()
            self.cwd = "/"
            try:
                await self._spawn("/")
            except _ShellExited as exc:
                raise SandboxBroken("the shell exited as soon as it started") from exc

    async def _spawn(self, cwd: str) -> None:
        argv = list(AGENT_SHELL)
        self._channel = await self._sandbox.open_process(argv, env=self._env, cwd=cwd, user=self._user)
        # The bootstrap answers like a command whose "status" is the shell's pid.
        self._frame = _Frame("READY", OutputCapture(4096))
        self._reader = asyncio.create_task(self._pump(self._channel))
        self._exited = asyncio.create_task(self._channel.wait())
        await self._channel.write_expecting(_BOOTSTRAP.encode(), self._frame.end)
        try:
            await wait_for(self._wait_frame(self._frame), START_TIMEOUT_SEC)
        except TimeoutError as exc:
            raise SandboxBroken("the shell did not start in time") from exc
        self.pid, _, _ = self._frame.parse_trailer()
        self._frame = None

    async def run(self, command: str, timeout: float, *, interrupt: asyncio.Event | None = None) -> CommandResult:
        """Run one command; never raises for the command's own failure, timeout or output.
        ``interrupt`` set while it runs stops it like a timeout does (``interrupted`` in the result)."""
        if self._channel is None:
            await self.start()
        assert self._channel is not None
        started = time.monotonic()
        capture, self._stray = self._stray, OutputCapture(self._output_limit)
        frame = self._frame = _Frame(secrets.token_hex(8), capture)
        lines = f"__tg_run {bash_quote(command)}\n{frame.nonce}\n"
        timed_out = interrupted = False
        try:
            await self._channel.write_expecting(lines.encode(), frame.end)
            await wait_for(self._wait_command(frame, interrupt), max(timeout, 0.001))
        except (TimeoutError, _Interrupted) as exc:
            timed_out, interrupted = not isinstance(exc, _Interrupted), isinstance(exc, _Interrupted)
            if not await self._interrupt(frame):
                result = await self._restarted(frame, started, timed_out=timed_out)
                return replace(result, interrupted=interrupted)
        except ShellProtocolError:
            raise
        except (SandboxError, _ShellExited):
            return await self._restarted(frame, started, timed_out=False)
        finally:
            self._frame = None
        status, cwd, jobs = frame.parse_trailer()
        self._background_pgids = jobs
        self.cwd = cwd or self.cwd
        return CommandResult(
            output=capture.text(),
            exit_code=None if timed_out or interrupted else status,
            timed_out=timed_out,
            interrupted=interrupted,
            dropped_bytes=capture.dropped_bytes,
            duration=time.monotonic() - started,
            cwd=self.cwd,
        )

    async def close(self) -> None:
        await cancel_and_wait(self._reader, self._exited)
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._reader = self._exited = None

    async def _wait_command(self, frame: _Frame, interrupt: asyncio.Event | None) -> None:
        """``_wait_frame``, or ``_Interrupted`` as soon as ``interrupt`` is set (checked first: a
        command that ended by then is not interrupted)."""
        if interrupt is None:
            return await self._wait_frame(frame)
        waiting = asyncio.ensure_future(self._wait_frame(frame))
        asked = asyncio.ensure_future(interrupt.wait())
        try:
            await asyncio.wait({waiting, asked}, return_when=asyncio.FIRST_COMPLETED)
            ended = waiting.done()
        finally:
            await cancel_and_wait(asked, None if waiting.done() else waiting)
        if not ended:
            raise _Interrupted()
        waiting.result()

    async def _wait_frame(self, frame: _Frame) -> None:
        assert self._exited is not None
        exited = asyncio.ensure_future(asyncio.shield(self._exited))
        try:
            await asyncio.wait({frame.done, exited}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            exited.cancel()
        if frame.done.done():
            frame.done.result()
            return
        # The shell is gone: give the pump a moment to drain what it printed last.
        with contextlib.suppress(TimeoutError):
            await wait_for(asyncio.shield(frame.done), 0.2)
        if frame.done.done() and frame.done.exception() is None:
            return
        raise _ShellExited()

    async def _interrupt(self, frame: _Frame) -> bool:
        """Kill the foreground of the running command; True if the shell answered afterwards."""
        assert self.pid is not None
        argv = ["/bin/sh", "-c", _INTERRUPT, "sh", str(self.pid), *map(str, self._background_pgids)]
        deadline = time.monotonic() + INTERRUPT_GRACE_SEC
        while time.monotonic() < deadline:
            with contextlib.suppress(SandboxError):
                await self._sandbox.exec(argv, timeout=10, env={"PATH": "/usr/bin:/bin"}, cwd="/")
            with contextlib.suppress(TimeoutError, _ShellExited, SandboxError):
                await wait_for(self._wait_frame(frame), 0.3)
                return True
        return False

    async def _restarted(self, frame: _Frame, started: float, *, timed_out: bool) -> CommandResult:
        capture = frame.capture
        capture.feed(bytes(frame.pending) if not frame.in_trailer else b"")
        status = None
        if self._exited is not None and self._exited.done() and not self._exited.cancelled():
            status = self._exited.result()
        elif self.pid is not None:  # still running (it trapped the interrupt): end it for good
            with contextlib.suppress(SandboxError):
                await self._sandbox.exec(
                    ["kill", "-KILL", str(self.pid)], timeout=10, env={"PATH": "/usr/bin:/bin"}, cwd="/"
                )
        await self.close()
        await self.start()
        note = "[the shell was restarted; variables and background jobs were lost]"
        output = capture.text()
        return CommandResult(
            output=f"{output}\n{note}" if output else note,
            exit_code=None if timed_out else status,
            timed_out=timed_out,
            dropped_bytes=capture.dropped_bytes,
            duration=time.monotonic() - started,
            cwd=self.cwd,
            shell_restarted=True,
        )

    async def _pump(self, channel: ProcessChannel) -> None:
        while True:
            data = await channel.read(1 << 16)
            if not data:
                return
            if self._frame is not None:
                self._frame.feed(data)
            else:
                self._stray.feed(data)


class _Interrupted(Exception):
    """The caller asked to stop the running command."""


class _ShellExited(Exception):
    """The shell process ended while a command was running."""
