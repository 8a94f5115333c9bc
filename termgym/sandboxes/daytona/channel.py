"""A long-lived process in a Daytona sandbox, as a ``ProcessChannel``: one session command.

The process runs as an asynchronous command of its own Daytona session; its input goes through
``send_session_command_input``, its output (stdout and stderr) comes from the command's log stream,
and ``close`` deletes the session (the daemon kills its process group). Guarantees and limits:
- input arrives byte for byte as long as it is UTF-8 and travels in whole lines (``write`` holds a
  trailing partial line until its newline; ``close`` sends what is left);
- output is the log stream's text (invalid UTF-8 as U+FFFD) re-encoded; a line reaches the reader
  once it is complete or the process has exited;
- a dropped log stream is reopened (at most ``MAX_RECONNECTS`` times) without repeating a byte;
- the process never reads end-of-file on its input while it runs (``HOLD_INPUT``);
- every call has an explicit timeout; a refused write is retried for up to
  ``INPUT_READY_TIMEOUT`` seconds; every other failure is a ``SandboxError``.

How: docs/guides/backends.md#cloud-rollouts-on-daytona---backend-daytona."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from termgym.aio import cancel_and_wait, wait_for
from termgym.errors import SandboxError, SandboxGone
from termgym.sandboxes.base import ProcessChannel
from termgym.sandboxes.daytona.policy import command_line, encode_command

if TYPE_CHECKING:
    from daytona import AsyncSandbox

MAX_RECONNECTS = 3
INPUT_READY_TIMEOUT = 30.0
# The daemon's wrapper keeps the command's input FIFO open with a background writer, which may open
# it only after a first input was written and closed: the process would then read that input and
# then end-of-file. So the process holds its own input open for writing too (fd 9, read-write
# never blocks on a FIFO), before it reads anything.
HOLD_INPUT = "{ command exec 9<>/dev/stdin; } 2>/dev/null\n"


class SessionChannel(ProcessChannel):
    """One process in its own Daytona session; create with ``await SessionChannel.open(...)``."""

    def __init__(self, sandbox: AsyncSandbox, session_id: str, command_id: str, *, request_timeout: float) -> None:
        self._sandbox = sandbox
        self.session_id = session_id
        self.command_id = command_id
        self._timeout = request_timeout
        self._buffer = bytearray()
        self._data = asyncio.Event()
        self._eof = False
        self._received = 0  # bytes delivered since the start of the log, across reconnects
        self._skip = 0
        self._pending_input = b""
        self._write_lock = asyncio.Lock()
        self.exit_code: int | None = None
        self.closed = False
        self._follower = asyncio.create_task(self._follow())

    @classmethod
    async def open(
        cls, sandbox: AsyncSandbox, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, request_timeout: float
    ) -> SessionChannel:
        from daytona import DaytonaError, SessionExecuteRequest

        session_id = f"termgym-{uuid.uuid4().hex[:12]}"
        command = encode_command(HOLD_INPUT + command_line(argv, env, cwd))
        try:
            await sandbox.process.create_session(session_id, request_timeout=request_timeout)
            response = await sandbox.process.execute_session_command(
                session_id,
                SessionExecuteRequest(command=command, run_async=True, suppress_input_echo=True),
                timeout=max(1, int(request_timeout)),
            )
        except DaytonaError as exc:
            raise _channel_error("could not start a process in the sandbox", exc) from exc
        return cls(sandbox, session_id, response.cmd_id, request_timeout=request_timeout)

    async def write(self, data: bytes) -> None:
        async with self._write_lock:
            self._pending_input += data
            cut = self._pending_input.rfind(b"\n") + 1
            if cut:
                chunk, self._pending_input = self._pending_input[:cut], self._pending_input[cut:]
                await self._send(chunk)

    async def _send(self, chunk: bytes) -> None:
        from daytona import DaytonaError, DaytonaInternalServerError

        text = chunk.decode("utf-8", errors="replace")
        deadline = time.monotonic() + INPUT_READY_TIMEOUT
        while True:
            try:
                await self._sandbox.process.send_session_command_input(
                    self.session_id, self.command_id, text, request_timeout=self._timeout
                )
                return
            except DaytonaInternalServerError as exc:
                # The daemon creates the command's input FIFO from inside the session shell, so
                # the first input can arrive before the FIFO exists: it answers 500, try again.
                if time.monotonic() >= deadline or self._eof:
                    raise _channel_error("the process's input is closed", exc) from exc
                await asyncio.sleep(0.05)
            except DaytonaError as exc:
                raise _channel_error("the process's input is closed", exc) from exc

    async def read(self, max_bytes: int) -> bytes:
        while not self._buffer and not self._eof:
            self._data.clear()
            await self._data.wait()
        chunk = bytes(self._buffer[:max_bytes])
        del self._buffer[:max_bytes]
        return chunk

    async def wait(self) -> int | None:
        await asyncio.shield(self._follower)
        return self.exit_code

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        from daytona import DaytonaError

        if self._pending_input and not self._eof:
            with contextlib.suppress(SandboxError):
                await self._send(self._pending_input + b"\n")
        with contextlib.suppress(DaytonaError, TimeoutError):
            await wait_for(
                self._sandbox.process.delete_session(self.session_id, request_timeout=self._timeout), self._timeout + 5
            )
        await cancel_and_wait(self._follower)
        self._finish()

    # -- output ----------------------------------------------------------------------------------

    def _on_output(self, text: str) -> None:
        data = text.encode("utf-8", errors="surrogateescape")
        if self._skip:
            dropped = min(self._skip, len(data))
            data, self._skip = data[dropped:], self._skip - dropped
        if data:
            self._received += len(data)
            self._buffer += data
            self._data.set()

    async def _follow(self) -> None:
        from daytona import DaytonaError

        process = self._sandbox.process
        try:
            for _ in range(MAX_RECONNECTS + 1):
                with contextlib.suppress(DaytonaError):
                    await process.get_session_command_logs_async(
                        self.session_id, self.command_id, self._on_output, self._on_output
                    )
                try:
                    command = await process.get_session_command(
                        self.session_id, self.command_id, request_timeout=self._timeout
                    )
                except DaytonaError:
                    return  # the session or the sandbox is gone: the process is too
                if command.exit_code is not None:
                    self.exit_code = command.exit_code
                    return
                self._skip = self._received  # the log is replayed from its start
        finally:
            self._finish()

    def _finish(self) -> None:
        self._eof = True
        self._data.set()


def _channel_error(what: str, exc: Exception) -> SandboxError:
    from daytona import DaytonaNotFoundError

    message = f"{what}: {getattr(exc, 'message', None) or exc}"
    return SandboxGone(message) if isinstance(exc, DaytonaNotFoundError) else SandboxError(message)
