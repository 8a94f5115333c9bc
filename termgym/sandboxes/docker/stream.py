"""Commands in a container through the engine's exec API: the attached stream of the persistent
shell (``DockerChannel``, its multiplexed frames undone by ``FrameDemux``), a command run to
completion (``exec_blocking``), and ending one past its deadline from the host (``end_exec``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import struct
from pathlib import Path
from typing import Any

from termgym.errors import SandboxError
from termgym.output import OutputCapture
from termgym.sandboxes.base import ProcessChannel
from termgym.sandboxes.docker.engine import docker_client, engine_errors, in_thread
from termgym.sandboxes.host_processes import children


class DockerChannel(ProcessChannel):
    """An attached exec: stdin written raw, stdout/stderr frames demultiplexed into one stream."""

    def __init__(self, exec_id: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Any) -> None:
        self._exec_id = exec_id
        self._reader = reader
        self._writer = writer
        self._raw = raw
        self._demux = FrameDemux()
        self.closed = False

    async def write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise SandboxError("the shell's input is closed") from exc

    async def read(self, max_bytes: int) -> bytes:
        while True:
            try:
                chunk = await self._reader.read(max_bytes)
            except (ConnectionError, OSError):
                chunk = b""
            if not chunk:
                return b""
            payload = self._demux.feed(chunk)
            if payload:
                return payload

    async def wait(self) -> int | None:
        client = docker_client()
        while True:
            try:
                state = await in_thread(client.api.exec_inspect, self._exec_id)
            except engine_errors():
                return None
            if not state.get("Running"):
                return state.get("ExitCode")
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(OSError):
            self._writer.close()
        with contextlib.suppress(OSError):
            self._raw.close()


class FrameDemux:
    """Docker's multiplexed attach stream (8-byte header: stream, 0, 0, 0, big-endian size) to the
    concatenated payloads, stdout and stderr interleaved as they came. Handles any split."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> bytes:
        self._buffer += data
        out = bytearray()
        while len(self._buffer) >= 8:
            (size,) = struct.unpack(">I", self._buffer[4:8])
            if len(self._buffer) < 8 + size:
                break
            out += self._buffer[8 : 8 + size]
            del self._buffer[: 8 + size]
        return bytes(out)


def exec_blocking(client: Any, exec_id: str, capture: OutputCapture, errors: OutputCapture | None = None) -> int | None:
    """Start the exec ``exec_id``, feed ``capture`` until its output ends (its stderr kept apart in
    ``errors`` when given, else interleaved), close the stream (its socket), and return its exit
    code."""
    stream = client.api.exec_start(exec_id, stream=True, demux=errors is not None)
    try:
        for chunk in stream:
            out, err = chunk if errors is not None else (chunk, None)
            if out:
                capture.feed(out)
            if err and errors is not None:
                errors.feed(err)
    finally:
        stream.close()
    return client.api.exec_inspect(exec_id).get("ExitCode")


def end_exec(client: Any, exec_id: str, container: str) -> None:
    """Kill an exec's process and every process it started, where the engine runs on this host
    (each checked, by its cgroup, to be the container's); nothing where it does not."""
    import docker.errors

    try:
        pid = int(client.api.exec_inspect(exec_id).get("Pid") or 0)
    except (docker.errors.DockerException, ValueError):
        return
    if pid <= 0 or not in_container(pid, container):
        return
    tree, queue = [pid], [pid]
    while queue:
        found = children(queue.pop())
        tree += found
        queue += found
    for member in tree:
        if in_container(member, container):
            with contextlib.suppress(OSError):
                os.kill(member, signal.SIGKILL)


def in_container(pid: int, container: str) -> bool:
    """Whether the host process ``pid`` runs in ``container`` (its cgroup names the container)."""
    try:
        return container in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
