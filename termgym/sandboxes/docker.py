"""The Docker backend: the task's own image, one container per trial, through the engine's API.

What it covers: the task's Dockerfile built once per content hash (``termgym.images``), FROM aliases
for air-gapped builds, or the task's ``docker_image`` as is; one container per trial with network
``none`` (unless the task asks for network, which fails clearly when the engine has none), the
task's CPU and memory limits, a pids limit, a per-file size limit of the task's storage, the labels
DESIGN.md gives, and the engine's tiny init as PID 1 (it reaps zombies), running a ``sleep`` keeper.
The persistent shell runs over one attached exec stream; files move as tar archives through the
API. Killing the agent's processes kills every pid but the init and its keeper, from inside,
until none is left. ``stop`` removes the container on every path.

What it does not cover: a disk quota (overlay2 on ext4 has none; the per-file limit and the agent
timeout bound what one trial can write), the other services of a Terminal-Bench 1 compose file
(reported as unsupported), registries (nothing is pulled).

All docker-py calls are blocking; they run in a dedicated thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from termgym.aio import uninterrupted, wait_for
from termgym.errors import BackendUnavailable, SandboxError, SandboxGone
from termgym.images import ensure_task_image
from termgym.output import DEFAULT_OUTPUT_LIMIT, OutputCapture
from termgym.sandboxes.base import ExecResult, ProcessChannel, Sandbox, SandboxSpec

PIDS_LIMIT = 512
START_HINT = "start it with scripts/docker-engine.sh, or as root: dockerd --iptables=false --bridge=none &"
# Killing every agent process, from inside: every pid but PID 1 (the engine's init, which reaps
# zombies), the keeper it runs (its oldest child, first in its children list) and this script,
# until none is left alive. Builtins only, so the script never sees a child of its own; the pids
# limit keeps a fork bomb finite.
KILL_ALL = r"""
read -r keeper rest < /proc/1/task/1/children
keep=" 1 $keeper $$ "
attempt=0
while [ $attempt -lt 100 ]; do
  attempt=$((attempt + 1))
  left=0
  for p in /proc/[0-9]*; do
    pid=${p#/proc/}
    case "$keep" in *" $pid "*) continue ;; esac
    state=
    while read -r key value rest; do
      [ "$key" = State: ] && { state=$value; break; }
    done < "$p/status" 2>/dev/null
    [ -z "$state" ] || [ "$state" = Z ] && continue
    kill -9 "$pid" 2>/dev/null
    left=1
  done
  [ $left = 0 ] && exit 0
done
exit 1
"""

_pool = ThreadPoolExecutor(max_workers=64, thread_name_prefix="termgym-docker")
_client: Any = None


async def _run(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(_pool, functools.partial(fn, *args, **kwargs))


def docker_client() -> Any:
    """The process's one docker-py client (``DOCKER_HOST`` or the local socket), API version
    negotiated; ``BackendUnavailable`` with a one-line hint when the daemon does not answer."""
    global _client
    if _client is None:
        try:
            import docker
        except ImportError as exc:
            raise BackendUnavailable("the Docker backend needs the docker package: pip install docker") from exc
        try:
            client = docker.from_env(version="auto", timeout=120)
            client.ping()
        except docker.errors.DockerException as exc:
            where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
            raise BackendUnavailable(f"the Docker daemon is not answering at {where}; {START_HINT}") from exc
        _client = client
    return _client


class DockerSandbox(Sandbox):
    backend = "docker"

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec)
        self._container: str | None = None
        self._channels: list[_DockerChannel] = []

    async def start(self) -> None:
        client = await _run(docker_client)
        self._reject_compose_services()
        image = await ensure_task_image(
            client, name=self.spec.name, context_dir=self.spec.context_dir, dockerfile=self.spec.dockerfile,
            image=self.spec.image, aliases=self.spec.image_aliases, timeout=self.spec.build_timeout_sec, run=_run,
        )  # fmt: skip
        self.env = {**image.env, **dict(self.spec.env)}
        self.workdir = image.workdir
        network = "none"
        if self.spec.network:
            network = await _run(_network_for_task, client)
        labels = {"termgym": "1", **dict(self.spec.labels), "termgym.task": self.spec.name[:200]}
        resources = self.spec.resources
        import docker.types

        host_config = client.api.create_host_config(
            network_mode=network,
            nano_cpus=int(resources.cpus * 1e9),
            mem_limit=f"{resources.memory_mb}m",
            memswap_limit=f"{resources.memory_mb}m",
            pids_limit=PIDS_LIMIT,
            ulimits=[docker.types.Ulimit(name="fsize", soft=resources.storage_mb << 20, hard=resources.storage_mb << 20)],
            init=True,
        )

        async def discard(created: dict) -> None:  # cancelled while the engine was creating it
            with contextlib.suppress(Exception):
                await _run(client.api.remove_container, created["Id"], force=True)

        try:
            created = await uninterrupted(_run(
                client.api.create_container, image.tag, command=["sleep", "infinity"],
                labels=labels, host_config=host_config, working_dir=self.workdir, environment=dict(self.spec.env),
            ), discard)  # fmt: skip
            self._container = created["Id"]
            await _run(client.api.start, self._container)
        except Exception as exc:
            raise _mapped(exc, "could not start the container") from exc


    def _reject_compose_services(self) -> None:
        compose = self.spec.compose_file
        if compose is None or not compose.is_file():
            return
        import yaml

        try:
            services = (yaml.safe_load(compose.read_text()) or {}).get("services") or {}
        except yaml.YAMLError as exc:
            raise SandboxError(f"{compose}: invalid YAML: {exc}") from exc
        if isinstance(services, dict) and len(services) > 1:
            others = ", ".join(sorted(services)[1:] if "client" not in services else sorted(set(services) - {"client"}))
            raise SandboxError(f"{compose}: extra compose services ({others}) are not supported yet; only the main service is built")

    async def stop(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        if self._container is not None:
            container, self._container = self._container, None
            with contextlib.suppress(Exception):
                await _run(docker_client().api.remove_container, container, force=True)

    async def kill_agent_processes(self) -> None:
        """Kill from inside; if that cannot run (a fork bomb has used up the pids limit, so the
        engine cannot even start the killer), restart the container: every process goes, the files
        stay, as on the embedded backend. A container that is gone or stopped is not revived."""
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        client, container = docker_client(), self._require()
        capture = OutputCapture(4096)
        try:
            code = await wait_for(
                _run(_exec_blocking, client, container, ["/bin/sh", "-c", KILL_ALL], "/", capture), 60
            )
        except Exception as exc:
            raise _mapped(exc, "could not stop the agent's processes") from exc
        if code == 0:
            return
        try:
            await _run(client.api.restart, container, timeout=0)
        except Exception as exc:
            raise _mapped(exc, f"could not stop the agent's processes (exit {code}: {capture.text().strip()[:150]})") from exc
        self.warnings.append(f"the agent's processes could not be killed from inside (exit {code}); the container was restarted")

    def _require(self) -> str:
        if self._container is None:
            raise SandboxError("the container is not running")
        return self._container

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
        if stdin is not None:
            raise ValueError("the Docker backend's exec takes no stdin; use upload_tar for files")
        container = self._require()
        limit = max(timeout, 0.001)
        pairs = [f"{k}={v}" for k, v in (self.env if env is None else env).items()]
        command = ["timeout", "-k", "1", f"{limit:.3f}", "env", "-i", *pairs, *argv]
        capture = OutputCapture(output_limit)
        started = time.monotonic()
        try:
            code = await wait_for(
                _run(_exec_blocking, docker_client(), container, command, cwd or self.workdir, capture), limit + 10
            )
        except TimeoutError:
            code = None
        except Exception as exc:
            raise _mapped(exc, "exec failed") from exc
        timed_out = code is None or (code in (124, 137) and time.monotonic() - started >= limit)
        return ExecResult(
            exit_code=None if timed_out else code,
            output=capture.getvalue(),
            timed_out=timed_out,
            dropped_bytes=capture.dropped_bytes,
        )

    async def open_process(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str) -> ProcessChannel:
        container = self._require()
        pairs = [f"{k}={v}" for k, v in env.items()]
        client = docker_client()
        try:
            exec_id = (await _run(client.api.exec_create, container, ["env", "-i", *pairs, *argv], stdin=True, workdir=cwd))["Id"]
            raw = await _run(client.api.exec_start, exec_id, socket=True)
        except Exception as exc:
            raise _mapped(exc, "could not start the shell") from exc
        sock: socket.socket = raw._sock
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        channel = _DockerChannel(exec_id, reader, writer, raw)
        self._channels = [c for c in self._channels if not c.closed] + [channel]
        return channel

    async def upload_tar(self, archive: bytes, dest: str, *, timeout: float = 120.0) -> None:
        made = await self.exec(["mkdir", "-p", dest], timeout=timeout, cwd="/")
        if made.exit_code != 0:
            raise SandboxError(f"upload to {dest} failed: {made.text.strip()[:200]}")
        try:
            await wait_for(_run(docker_client().api.put_archive, self._require(), dest, archive), timeout)
        except Exception as exc:
            raise _mapped(exc, f"upload to {dest} failed") from exc


class _DockerChannel(ProcessChannel):
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
                state = await _run(client.api.exec_inspect, self._exec_id)
            except Exception:
                return None
            if not state.get("Running"):
                return state.get("ExitCode")
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            self._writer.close()
        with contextlib.suppress(Exception):
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


def _exec_blocking(client: Any, container: str, command: list[str], cwd: str, capture: OutputCapture) -> int | None:
    exec_id = client.api.exec_create(container, command, workdir=cwd)["Id"]
    for chunk in client.api.exec_start(exec_id, stream=True):
        capture.feed(chunk)
    return client.api.exec_inspect(exec_id).get("ExitCode")


def _network_for_task(client: Any) -> str:
    if client.api.networks(names=["bridge"]):
        return "bridge"
    raise SandboxError("the task needs network, but the Docker engine has no bridge network (dockerd --bridge=none)")


def _mapped(exc: Exception, what: str) -> SandboxError:
    """SDK errors to the termgym tree: a vanished or stopped container is SandboxGone."""
    import docker.errors

    if isinstance(exc, SandboxError):
        return exc
    if isinstance(exc, docker.errors.NotFound) or (isinstance(exc, docker.errors.APIError) and exc.status_code == 409):
        return SandboxGone(f"{what}: the container is gone or stopped")
    message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    return SandboxError(f"{what}: {message}")


def collect_garbage(remove_images: bool = False) -> tuple[int, int]:
    """Remove every container labelled ``termgym=1`` (and, if asked, every cached task image);
    returns (containers, images) removed."""
    import docker.errors

    client = docker_client()
    containers = client.api.containers(all=True, filters={"label": "termgym=1"})
    for container in containers:
        with contextlib.suppress(docker.errors.NotFound):
            client.api.remove_container(container["Id"], force=True)
    images = 0
    if remove_images:
        for image in client.api.images(filters={"label": "termgym=1"}):
            with contextlib.suppress(docker.errors.APIError):
                client.api.remove_image(image["Id"], force=True)
                images += 1
    return len(containers), images
