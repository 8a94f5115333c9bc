"""The Docker backend: the task's own image, one container per trial, through the engine's API.

What it covers: the task's ``docker_image`` (pulled per ``SandboxSpec.pull``), else its Dockerfile
built once per content hash (``termgym.images.build``), with network only when the task allows it
(never the host's network namespace), FROM aliases for air-gapped builds; the image's own
entrypoint runs with the keeper as its command (its services are up); one container per trial with network
``none`` (unless the task asks for network, which fails clearly when the engine has none), the
task's CPU (at most the engine's, with a warning) and memory limits, a pids limit, a per-file size
limit of the task's storage, the labels DESIGN.md gives, and the engine's tiny init as PID 1 (it
reaps zombies), running a ``sleep`` keeper. The persistent shell runs over one attached exec
stream; files move as tar archives through the API. Killing the agent's processes restarts the
container (its init is killed, so the kernel ends every process in it, the keeper included, which
a root process could otherwise rewrite through ``/proc/<pid>/mem``), then waits until the engine
lists the new keeper. ``changed_system_paths`` asks the engine what the container
changed against its image (``termgym.tamper``). ``stop`` removes the container on every path,
but after ``keep`` (``--keep``), which renames it ``termgym-kept-<id>`` and leaves it running for
``attach`` to enter again; the removal runs in the background (``remove_later``), and
``close_shared`` and the interpreter's exit wait for it. Every container is created from one
``Recipe`` (``termgym.sandboxes.docker_pool``), in one blocking call (create, start, find the
keeper); with ``TERMGYM_DOCKER_POOL`` set, ``start`` takes an identical, started container from
the warm pool when one is ready, and ``close_shared`` closes the pool.

What it does not cover: a disk quota (overlay2 on ext4 has none; the per-file limit and the agent
timeout bound what one trial can write), the other services of a Terminal-Bench 1 compose file
(reported as unsupported), registry credentials (``docker login`` is the engine's). The agent is root in the file system the
verifier then runs in: what it changed there is detected, not prevented (see ``termgym.tamper``).

All docker-py calls are blocking; they run in a dedicated thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import functools
import io
import os
import posixpath
import signal
import socket
import struct
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from termgym.aio import uninterrupted, wait_for
from termgym.errors import BackendUnavailable, ConfigError, SandboxBroken, SandboxError, SandboxGone
from termgym.images.build import ImageConfig, ensure_task_image
from termgym.output import DEFAULT_OUTPUT_LIMIT, OutputCapture
from termgym.sandboxes.base import DEFAULT_PATH, ExecResult, ProcessChannel, Resources, Sandbox, SandboxSpec
from termgym.sandboxes.changes import LINKED_DIRECTORIES, entrypoint_files, link_exits, system_changes
from termgym.sandboxes.docker_pool import (
    POOL_LABEL,
    Ready,
    Recipe,
    WarmPool,
    make_recipe,
    owner_gone,
    settings_from_env,
)
from termgym.sandboxes.host_processes import children, start_time
from termgym.sandboxes.limits import PIDS_LIMIT

START_HINT = "start it with scripts/docker-engine.sh, or as root: dockerd --iptables=false --bridge=none &"
RESTART_TIMEOUT = 30.0
SETTLE_TIMEOUT = 2.0  # how long a container the engine could not list may take to stop
# What the container runs under its init: by absolute path, never looked up on the container's PATH
# (an agent could plant a `sleep` there, which every restart would run again). /bin/sleep is the
# image's own as long as the tamper check finds no change under /bin or /usr.
KEEPER = ("/bin/sleep", "infinity")
KEEPER_COMMAND = " ".join(KEEPER)  # as the engine lists it (docker top's CMD)
_DIFF_KINDS = {0: "C", 1: "A", 2: "D"}

# Every link in the directories given ("$@", those that are directories and not links themselves)
# as: path NUL target NUL. GNU find lists them at once; elsewhere (busybox) the shell's loop does.
_LIST_LINKS = r"""
dirs=
for d; do [ -d "$d" ] && [ ! -L "$d" ] && dirs="$dirs $d"; done
[ -n "$dirs" ] || exit 0
find $dirs -maxdepth 1 -type l -printf '%p\0%l\0' 2>/dev/null && exit 0
for d in $dirs; do
  for f in "$d"/* "$d"/.[!.]*; do [ -L "$f" ] && printf '%s\0%s\0' "$f" "$(readlink "$f")"; done
done
exit 0
"""
_LINK_EXITS: dict[str, tuple[str, ...]] = {}  # per image id: where its system links lead out

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
            import docker.errors
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
        self._started_at = 0.0  # when this process last started or restarted the container
        self._keeper: str | None = None  # the keeper's host pid, as the engine lists it
        # what the tamper check watches besides system paths: the spec's, and the image's entrypoint
        # (which every restart runs again)
        self._watched: tuple[str, ...] = tuple(spec.watched)

    async def start(self) -> None:
        client = await _run(docker_client)
        await _sweep_orphans_once(client)
        image, recipe = await self._recipe(client)
        self.image = image.record()
        pool = warm_pool()
        try:
            taken = await pool.take(recipe) if pool is not None else None
            if taken is None:
                self._started_at = time.time()
                labels = pool.labels if pool is not None else {}
                taken = await uninterrupted(_run(_create_started, client, recipe, labels), _discard)
            else:
                self._started_at = time.time()  # stop requests count from the hand-over (``_fault``)
        except engine_errors() as exc:
            raise _mapped(exc, "could not start the container") from exc
        self._container, self._keeper = taken.container, taken.keeper
        self._watched = (*self._watched, *await self._link_exits(image.id))

    async def _link_exits(self, image_id: str) -> tuple[str, ...]:
        """Where the image's links in its system directories lead out of them
        (``termgym.sandboxes.changes.link_exits``), listed once per image (before any agent ran
        in this container: what it lists is the image's)."""
        if image_id not in _LINK_EXITS:
            listed = await self.exec(
                ["/bin/sh", "-c", _LIST_LINKS, "sh", *LINKED_DIRECTORIES],
                timeout=60,
                cwd="/",
                env={"PATH": DEFAULT_PATH},
                output_limit=4 << 20,
            )
            if listed.exit_code != 0 or listed.dropped_bytes:
                return ()  # an image without a shell or find: nothing found, nothing more watched
            fields = listed.output.decode("utf-8", errors="surrogateescape").split("\0")
            _LINK_EXITS[image_id] = link_exits(dict(zip(fields[0:-1:2], fields[1::2])))
        return _LINK_EXITS[image_id]

    async def _recipe(self, client: Any) -> tuple[ImageConfig, Recipe]:
        """The task's image (built or pulled as needed) and the recipe of its container; sets
        ``env``, ``workdir`` and the CPU warning."""
        self._reject_compose_services()
        image = await ensure_task_image(
            client,
            name=self.spec.name,
            context_dir=self.spec.context_dir,
            dockerfile=self.spec.dockerfile,
            image=self.spec.image,
            aliases=self.spec.image_aliases,
            timeout=self.spec.build_timeout_sec,
            run=_run,
            network=self.spec.network,
            pull=self.spec.pull,
            prefer_build=self.spec.prefer_build,
        )
        self.env = {**image.env, **dict(self.spec.env)}
        self.workdir = image.workdir
        self._watched = (*self.spec.watched, *entrypoint_files(image.entrypoint, image.workdir))
        network = "none"
        if self.spec.network:
            network = await _run(_network_for_task, client)
        resources = self.spec.resources
        cpus = resources.cpus
        engine_cpus = await _run(_engine_cpus, client)
        if engine_cpus and cpus > engine_cpus:
            self.warnings.append(
                f"the task asks for {cpus:g} CPUs; the Docker engine has {engine_cpus}: limited to {engine_cpus}"
            )
            cpus = float(engine_cpus)
        recipe = make_recipe(
            image_id=image.id,
            command=KEEPER,
            labels={"termgym": "1", **dict(self.spec.labels), "termgym.task": self.spec.name[:200]},
            working_dir=self.workdir,
            environment=dict(self.spec.env),
            network_mode=network,
            cpus=cpus,
            memory_mb=resources.memory_mb,
            storage_mb=resources.storage_mb,
            pids_limit=PIDS_LIMIT,
        )
        return image, recipe

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
            raise SandboxError(
                f"{compose}: extra compose services ({others}) are not supported yet; only the main service is built"
            )

    async def stop(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        if self._kept:  # keep(): the container stays for `termgym shell --attach`
            return
        if self._container is not None:
            container, self._container = self._container, None
            remove_later(container)

    async def kill_agent_processes(self) -> None:
        """Restart the container: killing its init makes the kernel end every process in it, so
        nothing is spared, whatever it did to itself; the files stay. Returns once the engine lists
        the new keeper (the image's entrypoint starts its services again beside it, as at the
        first start). A container that does not come back (its keeper was broken from inside) is
        ``SandboxBroken``."""
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        client, container = docker_client(), self._require()
        try:
            await wait_for(_run(client.api.restart, container, timeout=0), RESTART_TIMEOUT)
            self._started_at = time.time()
            deadline = time.monotonic() + RESTART_TIMEOUT
            while True:
                state = (await _run(client.api.inspect_container, container)).get("State") or {}
                if not state.get("Running"):
                    raise SandboxBroken(
                        f"the container stopped as soon as it restarted (exit {state.get('ExitCode')}): its keeper was broken from inside"
                    )
                top = await _run(client.api.top, container)
                keeper = _keeper_of(top)
                if keeper is not None:  # the restart ended every process; what runs now is the image's own
                    self._keeper = keeper
                    return
                if time.monotonic() > deadline:  # what the restart runs (the entrypoint) is the agent's to change
                    raise SandboxBroken(
                        f"the container's keeper ({KEEPER_COMMAND}) is not running {RESTART_TIMEOUT:g}s after a restart"
                    )
                await asyncio.sleep(0.02)
        except TimeoutError as exc:
            raise SandboxBroken(f"the container did not restart within {RESTART_TIMEOUT:g}s") from exc
        except engine_errors() as exc:
            raise await self._fault(exc, "could not end the agent's processes") from exc

    async def check_alive(self) -> None:
        """Returns while the container runs with its keeper; a container whose processes were
        killed from inside is ``SandboxBroken``, also when it stops between the engine's two
        answers (listing a dying container's processes fails; the state asked again says why)."""
        container = self._require()
        state = await self._state(container)
        if state.get("Running"):  # and its keeper too: the engine notices the init's exit a moment later
            try:
                top = await _run(docker_client().api.top, container)
            except engine_errors() as exc:
                state = await self._settled_state(container)
                if state.get("Running"):
                    raise await self._fault(exc, "could not list the container's processes") from exc
            else:
                if self._keeper is None or self._keeper in _column(top, "PID"):
                    return
        oom = " (out of memory)" if state.get("OOMKilled") else ""
        raise await self._fault(_Stopped(), f"the container stopped{oom}: its processes were all killed from inside")

    async def _state(self, container: str) -> dict:
        try:
            return (await _run(docker_client().api.inspect_container, container)).get("State") or {}
        except engine_errors() as exc:
            raise await self._fault(exc, "could not inspect the container") from exc

    async def _settled_state(self, container: str) -> dict:
        """The state once a container the engine could not list has had a moment to stop."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while (state := await self._state(container)).get("Running") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return state

    async def changed_system_paths(self) -> list[str] | None:
        """What the engine says the container changed under system paths, the spec's watched paths
        and the image's entrypoint. An engine that cannot list them once the agent has acted
        (a path longer than ``PATH_MAX`` makes it fail) is ``SandboxBroken``: the agent's doing."""
        try:
            changes = await _run(docker_client().api.diff, self._require())
        except engine_errors() as exc:
            raise await self._fault(exc, "could not list the container's changes") from exc
        listed = ((str(c.get("Path") or ""), _DIFF_KINDS.get(c.get("Kind"), "C")) for c in changes or [])
        return system_changes(listed, self._watched)

    async def _fault(self, exc: BaseException, what: str) -> SandboxError:
        """``_mapped``, told apart for a stopped container: stopped through the engine's API since
        this process last (re)started it (``docker kill``, ``docker stop``: from outside, so
        ``SandboxGone``), or by its own processes (``SandboxBroken``). The agent cannot reach the API."""
        error = _mapped(exc, what)
        if isinstance(error, SandboxBroken) and self._container is not None:
            with contextlib.suppress(*engine_errors()):
                events = await _run(_stop_requests, docker_client(), self._container, self._started_at)
                if events:
                    return SandboxGone(f"{what}: the container was stopped from outside ({events[0]})")
        return error

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
        return await self.exec_as(None, argv, timeout=timeout, env=env, cwd=cwd, output_limit=output_limit)

    supports_users = True  # the engine's exec runs as any user: a name from the image's passwd, or a uid

    async def exec_as(
        self,
        user: str | None,
        argv: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        output_limit: int = DEFAULT_OUTPUT_LIMIT,
    ) -> ExecResult:
        """Run ``argv`` through the engine's exec, with exactly ``env`` (the exec API's own
        environment: the container's variables ``env`` lacks are unset) and a deadline kept here,
        not by a ``timeout`` in the container: nothing is looked up on the container's ``PATH``
        but ``argv[0]`` itself, on ``env``'s. At the deadline the command's processes are killed
        where the engine runs on this host; elsewhere they are left to the next kill step."""
        container = self._require()
        limit = max(timeout, 0.001)
        capture = OutputCapture(output_limit)
        client = docker_client()
        environment = self._exec_environment(self.env if env is None else env)
        try:
            exec_id = (
                await _run(
                    client.api.exec_create,
                    container,
                    list(argv),
                    workdir=cwd or self.workdir,
                    user=user or "",
                    environment=environment,
                )
            )["Id"]
            try:
                code = await wait_for(_run(_exec_blocking, client, exec_id, capture), limit)
            except TimeoutError:
                code = None
                await _run(_end_exec, client, exec_id, container)
        except engine_errors() as exc:
            raise await self._fault(exc, "exec failed") from exc
        return ExecResult(
            exit_code=code,
            output=capture.getvalue(),
            timed_out=code is None,
            dropped_bytes=capture.dropped_bytes,
        )

    def _exec_environment(self, env: Mapping[str, str]) -> list[str]:
        """The exec API's environment that makes a command's environment exactly ``env``: the
        engine adds the container's own variables (and ``HOSTNAME``) to an exec's, and an entry
        without ``=`` unsets one."""
        unset = [name for name in dict.fromkeys([*self.env, "HOSTNAME"]) if name not in env]
        return [*unset, *(f"{name}={value}" for name, value in env.items())]

    async def open_process(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str) -> ProcessChannel:
        return await self.open_process_as(None, argv, env=env, cwd=cwd)

    async def open_process_as(
        self, user: str | None, argv: Sequence[str], *, env: Mapping[str, str], cwd: str
    ) -> ProcessChannel:
        container = self._require()
        client = docker_client()
        try:
            exec_id = (
                await _run(
                    client.api.exec_create,
                    container,
                    list(argv),
                    stdin=True,
                    workdir=cwd,
                    user=user or "",
                    environment=self._exec_environment(env),
                )
            )["Id"]
            raw = await _run(client.api.exec_start, exec_id, socket=True)
        except engine_errors() as exc:
            raise await self._fault(exc, "could not start the shell") from exc
        sock: socket.socket = raw._sock
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        channel = _DockerChannel(exec_id, reader, writer, raw)
        self._channels = [c for c in self._channels if not c.closed] + [channel]
        return channel

    async def set_network(self, enabled: bool) -> str | None:
        """Connect the container to the engine's bridge network, or disconnect it from every
        network but ``none``; a line saying why not when the engine has no bridge."""
        container = self._require()
        try:
            return await _run(_switch_network, docker_client(), container, enabled)
        except engine_errors() as exc:
            raise await self._fault(exc, "could not change the sandbox's network") from exc

    async def upload_tar(self, archive: bytes, dest: str, *, timeout: float = 120.0) -> None:
        """Unpack ``archive`` under ``dest`` through the engine (its members re-rooted at ``/``, so
        the engine makes ``dest`` and every missing parent; no program of the container runs)."""
        try:
            rooted = rooted_archive(archive, dest)
            await wait_for(_run(docker_client().api.put_archive, self._require(), "/", rooted), timeout)
        except TimeoutError as exc:
            raise SandboxBroken(f"upload to {dest} did not finish within {timeout:g}s") from exc
        except engine_errors() as exc:
            raise await self._fault(exc, f"upload to {dest} failed") from exc

    async def download_tar(self, paths: Sequence[str], *, limit: int, timeout: float = 120.0) -> bytes:
        """The engine's archive of each of ``paths`` that exists (``get_archive``: the container's
        own ``tar`` never runs), one archive named relative to ``/``; read as it streams and
        ``SandboxBroken`` past ``limit`` bytes (a sparse file counts at its full size) or
        ``timeout`` seconds."""
        container = self._require()
        try:
            return await wait_for(_run(_archive_of, docker_client(), container, paths, limit), timeout)
        except TimeoutError as exc:
            raise SandboxBroken(f"could not read {', '.join(paths)} within {timeout:g}s") from exc
        except _OverLimit as exc:
            raise SandboxBroken(f"could not read {', '.join(paths)}: over {limit >> 20} MB") from exc
        except tarfile.TarError as exc:
            raise SandboxBroken(
                f"could not read {', '.join(paths)}: the engine's archive is malformed ({exc})"
            ) from exc
        except engine_errors() as exc:
            raise await self._fault(exc, f"could not read {', '.join(paths)}") from exc

    # -- keep and attach (--keep, termgym shell --attach) -------------------------------------------

    _kept = False  # keep() ran: stop() leaves the container running

    async def keep(self) -> dict[str, str]:
        """Leave the container running: it is renamed ``termgym-kept-<id>`` (the name attach and gc
        know it by) and ``stop`` no longer removes it."""
        container = self._require()
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        name = f"{KEPT_PREFIX}{container[:12]}"
        client = docker_client()
        try:
            if (await _run(client.api.inspect_container, container)).get("Name", "").lstrip("/") != name:
                await _run(client.api.rename, container, name)  # kept before (attached, then kept again): as is
        except engine_errors() as exc:
            raise await self._fault(exc, "could not keep the container") from exc
        self._kept = True
        return {
            "backend": "docker",
            "id": name,
            "attach": f"termgym shell --attach {name} --backend docker",
            "remove": f"termgym gc --backend docker {name}",  # or docker rm -f NAME
        }


KEPT_PREFIX = "termgym-kept-"  # the name keep() gives a container


async def attach(sandbox_id: str) -> DockerSandbox:
    """The kept container ``sandbox_id`` (its name or id), started: running, labelled ``termgym=1``
    and named by ``keep``; its environment and working directory are the container's own, and
    ``stop`` removes it. ``ConfigError`` in one line when there is no such kept container."""
    import docker.errors

    missing = ConfigError(f"no kept sandbox {sandbox_id} (termgym gc removed it, or it was never kept)")
    client = await _run(docker_client)
    try:
        info = await _run(client.api.inspect_container, sandbox_id)
        top = await _run(client.api.top, info["Id"]) if (info.get("State") or {}).get("Running") else None
    except docker.errors.NotFound:
        raise missing from None
    except docker.errors.APIError as exc:
        if exc.status_code in (400, 404, 409):
            raise missing from None
        raise _mapped(exc, f"could not inspect {sandbox_id}") from exc
    config, host = info.get("Config") or {}, info.get("HostConfig") or {}
    labels = config.get("Labels") or {}
    if top is None or labels.get("termgym") != "1" or not str(info.get("Name", "")).lstrip("/").startswith(KEPT_PREFIX):
        raise missing
    sandbox = DockerSandbox(
        SandboxSpec(
            name=labels.get("termgym.task", sandbox_id),
            context_dir=None,
            dockerfile=None,
            image=config.get("Image"),
            resources=_resources_of(host),
            labels={k: v for k, v in labels.items() if k not in ("termgym", "termgym.task")},
        )
    )
    sandbox._container = info["Id"]
    sandbox._started_at = time.time()
    sandbox._keeper = _keeper_among(top)
    sandbox.env = dict(pair.split("=", 1) for pair in config.get("Env") or [] if "=" in pair)
    sandbox.workdir = config.get("WorkingDir") or "/"
    sandbox.image = {"ref": str(config.get("Image") or ""), "digest": str(info.get("Image") or "")}
    return sandbox


def _resources_of(host_config: dict) -> Resources:
    """The CPU, memory and per-file size limits a container was created with (``start``)."""
    fsize = [u for u in host_config.get("Ulimits") or [] if u.get("Name") == "fsize"]
    defaults = Resources()
    return Resources(
        cpus=(host_config.get("NanoCpus") or 0) / 1e9 or defaults.cpus,
        memory_mb=(host_config.get("Memory") or 0) >> 20 or defaults.memory_mb,
        storage_mb=(fsize[0].get("Hard") or 0) >> 20 if fsize else defaults.storage_mb,
    )


def _keeper_among(top: dict) -> str | None:
    """The keeper's pid in a running container's process list, orphans the agent left included:
    the oldest ``KEEPER_COMMAND`` whose parent is the container's init."""
    pids, parents, commands = _column(top, "PID"), _column(top, "PPID"), _column(top, "CMD")
    inits = {pid for pid, parent in zip(pids, parents) if parent not in pids}
    keepers = [pid for pid, parent, cmd in zip(pids, parents, commands) if parent in inits and cmd == KEEPER_COMMAND]
    return min(keepers, key=int) if keepers else None


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


def _exec_blocking(client: Any, exec_id: str, capture: OutputCapture) -> int | None:
    for chunk in client.api.exec_start(exec_id, stream=True):
        capture.feed(chunk)
    return client.api.exec_inspect(exec_id).get("ExitCode")


def _end_exec(client: Any, exec_id: str, container: str) -> None:
    """Kill an exec's process and every process it started, where the engine runs on this host
    (each checked, by its cgroup, to be the container's); nothing where it does not."""
    import docker.errors

    try:
        pid = int(client.api.exec_inspect(exec_id).get("Pid") or 0)
    except (docker.errors.DockerException, ValueError):
        return
    if pid <= 0 or not _in_container(pid, container):
        return
    tree, queue = [pid], [pid]
    while queue:
        found = children(queue.pop())
        tree += found
        queue += found
    for member in tree:
        if _in_container(member, container):
            with contextlib.suppress(OSError):
                os.kill(member, signal.SIGKILL)


def _in_container(pid: int, container: str) -> bool:
    """Whether the host process ``pid`` runs in ``container`` (its cgroup names the container)."""
    try:
        return container in Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False


class _OverLimit(Exception):
    """An archive streamed past its byte limit."""


def _archive_of(client: Any, container: str, paths: Sequence[str], limit: int) -> bytes:
    """One tar archive of the engine's archives of ``paths`` (those that exist), members named
    relative to ``/``; ``_OverLimit`` once more than ``limit`` bytes have streamed in all."""
    import docker.errors

    out = io.BytesIO()
    received = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target:
        for path in paths:
            try:
                stream, _ = client.api.get_archive(container, path)
            except docker.errors.NotFound:
                continue
            data = bytearray()
            try:
                for chunk in stream:
                    received += len(chunk)
                    if received > limit:
                        raise _OverLimit(path)
                    data += chunk
            finally:
                close = getattr(stream, "close", None)
                if close is not None:
                    close()
            parent = posixpath.dirname("/" + path.strip("/")).strip("/")
            with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:") as source:
                for member in source:
                    file = source.extractfile(member) if member.isfile() else None
                    member.name = posixpath.join(parent, member.name) if parent else member.name
                    target.addfile(member, file)
    return out.getvalue() if received else b""


def rooted_archive(archive: bytes, dest: str) -> bytes:
    """``archive`` with every member moved under ``dest`` (absolute), named relative to ``/``."""
    prefix = dest.strip("/")
    if not prefix:
        return archive
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as source, tarfile.open(fileobj=out, mode="w") as target:
        for member in source:
            file = source.extractfile(member) if member.isfile() else None
            name = member.name.lstrip("/").removeprefix("./")
            member.name = f"{prefix}/{name}" if name not in ("", ".") else prefix
            target.addfile(member, file)
    return out.getvalue()


def _switch_network(client: Any, container: str, enabled: bool) -> str | None:
    attached = set(client.api.inspect_container(container)["NetworkSettings"].get("Networks") or {})
    connected = attached - {"none"}
    if enabled == bool(connected):
        return None
    if not enabled:
        for name in sorted(connected):
            client.api.disconnect_container_from_network(container, name)
        return None
    if not client.api.networks(names=["bridge"]):
        return "the Docker engine has no bridge network (dockerd --bridge=none); the sandbox stays without network"
    if "none" in attached:
        client.api.disconnect_container_from_network(container, "none")
    client.api.connect_container_to_network(container, "bridge")
    return None


def _network_for_task(client: Any) -> str:
    if client.api.networks(names=["bridge"]):
        return "bridge"
    raise SandboxError(
        "the task needs network, but the Docker engine has no bridge network (dockerd --bridge=none); "
        "run it without network with --network none, or give the engine a bridge"
    )


def _column(top: dict, title: str) -> list[str]:
    """One column of the engine's process list (``docker top``)."""
    titles = top.get("Titles") or []
    index = titles.index(title) if title in titles else None
    return [row[index] for row in top.get("Processes") or []] if index is not None else []


def _keeper_of(top: dict) -> str | None:
    """The keeper's pid in a fresh container's process list: the one process running ``KEEPER``
    (the image's entrypoint may run services beside it, and execs or runs the keeper as the
    command). Recorded before the agent runs anything, so no process of the agent's is among them."""
    keepers = [pid for pid, command in zip(_column(top, "PID"), _column(top, "CMD")) if command == KEEPER_COMMAND]
    return keepers[0] if len(keepers) == 1 else None


# -- creating and removing containers, the warm pool -------------------------------------------------


def _create_started(client: Any, recipe: Recipe, labels: Mapping[str, str]) -> Ready:
    """Create a container from ``recipe`` (``labels`` added to its own), start it and find its
    keeper, in one blocking call (no loop hop between the engine's answers); the container is
    removed again when starting it fails."""
    import docker.types

    fsize = recipe.storage_mb << 20
    host_config = client.api.create_host_config(
        network_mode=recipe.network_mode,
        nano_cpus=recipe.nano_cpus,
        mem_limit=f"{recipe.memory_mb}m",
        memswap_limit=f"{recipe.memory_mb}m",
        pids_limit=recipe.pids_limit,
        ulimits=[docker.types.Ulimit(name="fsize", soft=fsize, hard=fsize)],
        init=recipe.init,
    )
    created = client.api.create_container(
        recipe.image,
        command=list(recipe.command),
        labels={**dict(recipe.labels), **labels},
        host_config=host_config,
        working_dir=recipe.working_dir,
        environment=dict(recipe.environment),
    )
    try:
        client.api.start(created["Id"])
        return Ready(created["Id"], _keeper_of(client.api.top(created["Id"])))
    except BaseException:
        with contextlib.suppress(Exception):
            client.api.remove_container(created["Id"], force=True)
        raise


async def _discard(ready: Ready) -> None:  # made while its caller was cancelled
    remove_later(ready.container)


_removals: set[concurrent.futures.Future[None]] = set()
_removals_lock = threading.Lock()


def remove_later(container: str) -> None:
    """Start removing ``container`` by force in the backend's thread pool and return at once (a
    trial need not wait for the engine to tear its container down); ``wait_for_removals`` waits
    for it, and so do ``close_shared`` and the interpreter's exit. Never raises."""

    def remove() -> None:
        with contextlib.suppress(Exception):
            docker_client().api.remove_container(container, force=True)

    try:
        future = _pool.submit(remove)
    except RuntimeError:  # the interpreter is shutting down: no new threads, remove it here
        remove()
        return
    with _removals_lock:
        _removals.add(future)
    future.add_done_callback(_removed)


def _removed(future: concurrent.futures.Future[None]) -> None:
    with _removals_lock:
        _removals.discard(future)


def wait_for_removals(timeout: float | None = None) -> None:
    """Block until every removal ``remove_later`` started has ended (or ``timeout`` seconds)."""
    with _removals_lock:
        pending = list(_removals)
    concurrent.futures.wait(pending, timeout=timeout)


class _PoolEngine:
    """``termgym.sandboxes.docker_pool.PoolEngine`` on this backend."""

    async def create_started(self, recipe: Recipe, labels: Mapping[str, str]) -> Ready:
        client = await _run(docker_client)
        return await uninterrupted(_run(_create_started, client, recipe, labels), _discard)

    async def is_running(self, container: str) -> bool:
        import docker.errors

        try:
            state = (await _run(docker_client().api.inspect_container, container)).get("State") or {}
        except docker.errors.NotFound:
            return False
        return state.get("Status") == "running" and bool(state.get("Running"))

    def discard(self, container: str) -> None:
        remove_later(container)

    async def drain(self) -> None:
        await asyncio.to_thread(wait_for_removals)


_warm: tuple[asyncio.AbstractEventLoop, WarmPool] | None = None


def warm_pool_on() -> bool:
    """Whether ``TERMGYM_DOCKER_POOL`` and ``TERMGYM_DOCKER_POOL_TOTAL`` turn the warm pool on."""
    return settings_from_env(os.environ).enabled


def warm_pool() -> WarmPool | None:
    """The process's warm pool (``termgym.sandboxes.docker_pool``), sized by
    ``TERMGYM_DOCKER_POOL`` and ``TERMGYM_DOCKER_POOL_TOTAL``, or None while they turn it off.
    One per event loop: a pool an earlier loop left open has its idle containers removed."""
    global _warm
    loop = asyncio.get_running_loop()
    if _warm is not None and _warm[0] is not loop:
        _warm[1].abandon()
        _warm = None
    if _warm is None:
        settings = settings_from_env(os.environ)
        if not settings.enabled:
            return None
        _warm = (loop, WarmPool(_PoolEngine(), settings))
    return _warm[1]


async def prewarm(specs: Sequence[SandboxSpec], count: int | None = None) -> int:
    """Fill the warm pool for ``specs`` (their images built or pulled now), up to ``count`` each
    (default the per-image bound), and wait until those containers are started; how many are
    ready for them. 0 when the pool is off."""
    pool = warm_pool()
    if pool is None:
        return 0
    client = await _run(docker_client)
    await _sweep_orphans_once(client)
    recipes = [(await DockerSandbox(spec)._recipe(client))[1] for spec in specs]
    return await pool.prewarm(recipes, count)


def remove_orphans(client: Any) -> int:
    """Remove the pooled containers (label ``termgym.pool``) whose owning process no longer runs
    on this host (a killed run's), kept ones (``--keep``) aside; how many were removed."""
    import docker.errors

    host, removed = socket.gethostname(), 0
    for container in client.api.containers(all=True, filters={"label": POOL_LABEL}):
        owner = (container.get("Labels") or {}).get(POOL_LABEL, "")
        kept = any(str(name).lstrip("/").startswith(KEPT_PREFIX) for name in container.get("Names") or [])
        if not kept and owner_gone(owner, host, start_time):
            with contextlib.suppress(docker.errors.NotFound):
                client.api.remove_container(container["Id"], force=True)
                removed += 1
    return removed


_swept = False


async def _sweep_orphans_once(client: Any) -> None:
    """``remove_orphans``, once per process, before its first container."""
    global _swept
    if not _swept:
        _swept = True
        with contextlib.suppress(Exception):
            await _run(remove_orphans, client)


@atexit.register
def _remove_pool_at_exit() -> None:  # a process that never called close_shared leaves nothing idle
    if _warm is not None and _client is not None:
        for container in _warm[1].abandon(discard=False):
            with contextlib.suppress(Exception):
                _client.api.remove_container(container, force=True)


def _stop_requests(client: Any, container: str, since: float) -> list[str]:
    """The engine's kill and stop events for ``container`` since ``since`` (requests made through its API)."""
    until = time.time() + 1
    events = client.api.events(
        since=since, until=until, decode=True, filters={"container": container, "event": ["kill", "stop"]}
    )
    return [f"docker {e.get('Action') or e.get('status')}" for e in events]


@functools.cache
def _engine_cpus(client: Any) -> int | None:
    """The engine's CPU count (asked once per client), or None when it does not say."""
    try:
        return int(client.info().get("NCPU") or 0) or None
    except Exception:  # noqa: BLE001 - the limit is then the task's own
        return None


class _Stopped(Exception):
    """The engine says the container is not running (as a 409 would)."""


def engine_errors() -> tuple[type[Exception], ...]:
    """What a call to the engine raises for a fault of the engine or of the connection to it
    (the SDK's errors, the HTTP library's, the OS's); anything else is a bug of termgym's and is
    not dressed up as a sandbox fault."""
    import docker.errors
    import requests

    return (docker.errors.DockerException, requests.RequestException, OSError)


def _mapped(exc: BaseException, what: str) -> SandboxError:
    """SDK errors to the termgym tree: a removed container is SandboxGone; one that stopped (its
    init ended: every process in it was killed from inside, or its memory ran out) SandboxBroken;
    so is an engine that fails on what the container holds (a server error: a path longer than
    ``PATH_MAX`` breaks its diff, an archive whose entries conflict its upload), since what a
    container holds once the agent has acted is the agent's doing."""
    import docker.errors

    if isinstance(exc, SandboxError):
        return exc
    if isinstance(exc, _Stopped):
        return SandboxBroken(what)
    message = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, docker.errors.NotFound):
        return SandboxGone(f"{what}: the container is gone")
    if isinstance(exc, docker.errors.APIError) and exc.status_code == 409:
        return SandboxBroken(f"{what}: the container has stopped (its processes were all killed from inside)")
    if isinstance(exc, docker.errors.APIError) and exc.is_server_error():
        return SandboxBroken(f"{what}: the engine failed on what the container holds: {message}")
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


# -- the backend registry's hooks (termgym.sandboxes) ----------------------------------------------


def preflight() -> None:
    """``BackendUnavailable`` unless the Docker engine answers."""
    docker_client()


async def remove_leftovers(images: bool = False) -> str:
    """``termgym gc``: remove labelled containers, kept ones (``--keep``) included and named (and
    cached task images with ``images``); one line."""
    kept = await asyncio.to_thread(_kept_names)
    containers, removed = await asyncio.to_thread(collect_garbage, images)
    named = f" ({len(kept)} kept: {', '.join(kept)})" if kept else ""
    return f"removed {containers} leftover docker container(s){named} and {removed} cached task image(s)"


def _kept_names() -> list[str]:
    """The names of the containers ``keep`` left running."""
    containers = docker_client().api.containers(all=True, filters={"label": "termgym=1", "name": KEPT_PREFIX})
    names = [str(name).lstrip("/") for c in containers for name in c.get("Names") or []]
    return sorted(name for name in names if name.startswith(KEPT_PREFIX))


async def close_shared() -> None:
    """Close the warm pool (its idle containers removed, ``WarmPool.close``) and wait for the
    removals ``stop`` started: once it returns, nothing this process created is left."""
    global _warm
    if _warm is not None:
        (loop, pool), _warm = _warm, None
        if loop is asyncio.get_running_loop():
            await pool.close()
        else:
            pool.abandon()
    await asyncio.to_thread(wait_for_removals)
