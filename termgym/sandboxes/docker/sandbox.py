"""The Docker backend's sandbox (``termgym.sandboxes.docker`` says what it covers): a container of
the task's image, started or taken from the warm pool, its commands through the engine's exec API,
files through its archive API, the kill step (a restart), the agent's changes (the engine's diff), the traced exec,
and keep.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import socket
import tarfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from termgym.aio import uninterrupted, wait_for
from termgym.errors import SandboxBroken, SandboxError, SandboxGone
from termgym.images.build import ImageConfig, ensure_task_image
from termgym.output import OutputCapture
from termgym.sandboxes.base import Command, ExecResult, ProcessChannel, Sandbox, SandboxSpec
from termgym.sandboxes.changes import entrypoint_files, leaf_changes
from termgym.sandboxes.docker import tracer
from termgym.sandboxes.docker.containers import (
    KEPT_PREFIX,
    create_started,
    discard_ready,
    remove_later,
    sweep_orphans_once,
    warm_pool,
)
from termgym.sandboxes.docker.engine import (
    KEEPER,
    KEEPER_COMMAND,
    Stopped,
    dialect_of,
    docker_client,
    engine_cpus,
    engine_errors,
    in_thread,
    keeper_of,
    mapped_error,
    network_for_task,
    processes,
    stop_requests,
    switch_network,
    top_column,
)
from termgym.sandboxes.docker.pool import Recipe, make_recipe
from termgym.sandboxes.docker.stream import DockerChannel, end_exec, exec_blocking
from termgym.sandboxes.docker.tracer import tracer_argv
from termgym.sandboxes.docker.transfer import OverLimit, archive_of, rooted_archive
from termgym.sandboxes.limits import PIDS_LIMIT
from termgym.sandboxes.tracing import TRACE_LIMIT, traced_argv

RESTART_TIMEOUT = 30.0
SETTLE_TIMEOUT = 2.0  # how long a container the engine could not list may take to stop

_DIFF_KINDS = {0: "C", 1: "A", 2: "D"}


def diff_kinds(changes: list[dict] | None) -> dict[str, str]:
    """The engine's diff (``docker diff``) as ``{path: A|C|D}``."""
    return {str(c.get("Path") or ""): _DIFF_KINDS.get(int(c.get("Kind") or 0), "C") for c in changes or []}


class DockerSandbox(Sandbox):
    backend = "docker"

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec)
        self._container: str | None = None
        self._channels: list[DockerChannel] = []
        self._started_at = 0.0  # when this process last started or restarted the container
        self._keeper: str | None = None  # the keeper's pid as the engine lists it (Podman: in the container)
        self._tracer_dir: str | None = None  # where termgym's tracer is put into the container
        self._traced = False  # and it is there
        self._engine_changes: dict[str, str] = {}  # what the engine's diff lists before the agent ran

    async def start(self) -> None:
        client = await in_thread(docker_client)
        await sweep_orphans_once(client)
        image, recipe = await self._recipe(client)
        self.image = image.record()
        pool = warm_pool()
        try:
            taken = await pool.take(recipe) if pool is not None else None
            if taken is None:
                self._started_at = time.time()
                labels = pool.labels if pool is not None else {}
                taken = await uninterrupted(in_thread(create_started, client, recipe, labels), discard_ready)
            else:
                self._started_at = time.time()  # stop requests count from the hand-over (``_fault``)
        except engine_errors() as exc:
            raise mapped_error(exc, "could not start the container") from exc
        self._container, self._keeper = taken.container, taken.keeper
        if dialect_of(client).hides_own_files:
            try:
                self._engine_changes = diff_kinds(await in_thread(client.api.diff, self._container))
            except engine_errors() as exc:
                raise mapped_error(exc, "could not list the new container's changes") from exc

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
            run=in_thread,
            network=self.spec.network,
            pull=self.spec.pull,
            prefer_build=self.spec.prefer_build,
        )
        self.env = {**image.env, **dict(self.spec.env)}
        self.workdir = image.workdir
        self.default_user = image.user  # the engine's exec runs as it where no user is named
        # What runs outside the tracer's sight: each restart's keeper and entrypoint, the tracer's
        # loader's preload list.
        keeper = (KEEPER[0], f"/usr{KEEPER[0]}")
        self.untraced_loads = (*keeper, *entrypoint_files(image.entrypoint, image.workdir), *tracer.UNTRACED)
        network = "none"
        if self.spec.network:
            network = await in_thread(network_for_task, client)
        resources = self.spec.resources
        cpus = resources.cpus
        available = await in_thread(engine_cpus, client)
        if available and cpus > available:
            self.warnings.append(
                f"the task asks for {cpus:g} CPUs; the Docker engine has {available}: limited to {available}"
            )
            cpus = float(available)
        self.warnings += (await in_thread(dialect_of, client)).limit_warnings()
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
            await wait_for(in_thread(client.api.restart, container, timeout=0), RESTART_TIMEOUT)
            self._started_at = time.time()
            deadline = time.monotonic() + RESTART_TIMEOUT
            while True:
                state = (await in_thread(client.api.inspect_container, container)).get("State") or {}
                if not state.get("Running"):
                    raise SandboxBroken(
                        f"the container stopped as soon as it restarted (exit {state.get('ExitCode')}): "
                        "its keeper was broken from inside"
                    )
                top = await in_thread(processes, client, container)
                keeper = keeper_of(top)
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
                top = await in_thread(processes, docker_client(), container)
            except engine_errors() as exc:
                state = await self._settled_state(container)
                if state.get("Running"):
                    raise await self._fault(exc, "could not list the container's processes") from exc
            else:
                if self._keeper is None or self._keeper in top_column(top, "PID"):
                    return
        oom = " (out of memory)" if state.get("OOMKilled") else ""
        raise await self._fault(Stopped(), f"the container stopped{oom}: its processes were all killed from inside")

    async def _state(self, container: str) -> dict:
        try:
            return (await in_thread(docker_client().api.inspect_container, container)).get("State") or {}
        except engine_errors() as exc:
            raise await self._fault(exc, "could not inspect the container") from exc

    async def _settled_state(self, container: str) -> dict:
        """The state once a container the engine could not list has had a moment to stop."""
        deadline = time.monotonic() + SETTLE_TIMEOUT
        while (state := await self._state(container)).get("Running") and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return state

    async def agent_changes(self) -> dict[str, str] | None:
        """Every path the engine says the container changed against its image (``leaf_changes``), but
        termgym's own tracer and what the engine listed as its own before the agent ran (an engine
        that ``Dialect.hides_own_files``: the directories of its files, listed the same again). An
        engine that cannot list them once the agent has acted (a path longer than ``PATH_MAX``
        makes it fail) is ``SandboxBroken``: the agent's doing."""
        try:
            changes = await in_thread(docker_client().api.diff, self._require())
        except engine_errors() as exc:
            raise await self._fault(exc, "could not list the container's changes") from exc
        listed = {p: k for p, k in diff_kinds(changes).items() if self._engine_changes.get(p) != k}
        own = self._tracer_dir
        return leaf_changes({p: k for p, k in listed.items() if not own or (p != own and not p.startswith(own + "/"))})

    async def exec_traced(self, command: Command) -> ExecResult | None:
        """Under termgym's tracer (``termgym.sandboxes.docker.tracer``), put into the container once
        at a name no one could guess; None where this host has no ``strace`` to bring."""
        directory = await self._tracer()
        if directory is None:
            return None
        return await self._exec(replace(command, argv=traced_argv(tracer_argv(directory), command.argv)), trace=True)

    async def _tracer(self) -> str | None:
        if self._tracer_dir is None:
            archive = await in_thread(tracer.bundle)
            if archive is None:
                return None
            directory = f"/.termgym-trace-{secrets.token_hex(8)}"
            self._tracer_dir = directory  # named before it exists: agent_changes leaves it out
            try:
                await self.upload_tar(archive, directory)
            except BaseException:
                self._tracer_dir = None
                raise
            self._traced = True
        return self._tracer_dir if self._traced else None

    async def _fault(self, exc: BaseException, what: str) -> SandboxError:
        """``_mapped``, told apart for a stopped container: stopped through the engine's API since
        this process last (re)started it (``docker kill``, ``docker stop``: from outside, so
        ``SandboxGone``), or by its own processes (``SandboxBroken``). The agent cannot reach the API."""
        error = mapped_error(exc, what)
        if isinstance(error, SandboxBroken) and self._container is not None:
            with contextlib.suppress(*engine_errors()):
                events = await in_thread(stop_requests, docker_client(), self._container, self._started_at)
                if events:
                    return SandboxGone(f"{what}: the container was stopped from outside ({events[0]})")
        return error

    def _require(self) -> str:
        if self._container is None:
            raise SandboxError("the container is not running")
        return self._container

    supports_users = True  # the engine's exec runs as any user: a name from the image's passwd, or a uid

    async def run(self, command: Command) -> ExecResult:
        """Run the command through the engine's exec, with exactly its ``env`` (the exec API's own
        environment: the container's variables ``env`` lacks are unset) and a deadline kept here,
        not by a ``timeout`` in the container: nothing is looked up on the container's ``PATH``
        but ``argv[0]`` itself, on ``env``'s. At the deadline the command's processes are killed
        where the engine runs on this host; elsewhere they are left to the next kill step. No
        ``stdin`` (``ValueError``): files go by ``upload_tar``."""
        if command.stdin is not None:
            raise ValueError("the Docker backend's exec takes no stdin; use upload_tar for files")
        return await self._exec(command, trace=False)

    async def _exec(self, command: Command, *, trace: bool) -> ExecResult:
        container = self._require()
        limit = max(command.timeout, 0.001)
        capture = OutputCapture(command.output_limit)
        traced = OutputCapture(TRACE_LIMIT) if trace else None
        client = docker_client()
        env = self.env if command.env is None else command.env
        environment = self._exec_environment(env, dialect_of(client).unsets_env)
        try:
            exec_id = (
                await in_thread(
                    client.api.exec_create,
                    container,
                    list(command.argv),
                    workdir=command.cwd or self.workdir,
                    user=command.user or "",
                    environment=environment,
                )
            )["Id"]
            try:
                code = await wait_for(in_thread(exec_blocking, client, exec_id, capture, traced), limit)
            except TimeoutError:
                code = None
                await in_thread(end_exec, client, exec_id, container)
        except engine_errors() as exc:
            raise await self._fault(exc, "exec failed") from exc
        return ExecResult(
            exit_code=code,
            output=capture.getvalue(),
            timed_out=code is None,
            dropped_bytes=capture.dropped_bytes,
            trace=traced.getvalue() if traced is not None else None,
            trace_dropped=traced.dropped_bytes if traced is not None else 0,
        )

    def _exec_environment(self, env: Mapping[str, str], unsets: bool = True) -> list[str]:
        """The exec API's environment that makes a command's environment exactly ``env``: the
        engine adds the container's own variables (and ``HOSTNAME``) to an exec's, and an entry
        without ``=`` unsets one. Where the engine refuses that (``Dialect.unsets_env``), each is
        set empty instead, which no search path reads as a directory (an image's ``PERL5LIB`` or
        ``BASH_ENV`` the verifier's environment leaves out must not reach it)."""
        unset = [name for name in dict.fromkeys([*self.env, "HOSTNAME"]) if name not in env]
        return [
            *(name if unsets else f"{name}=" for name in unset),
            *(f"{name}={value}" for name, value in env.items()),
        ]

    async def open_process(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, user: str | None = None
    ) -> ProcessChannel:
        container = self._require()
        client = docker_client()
        try:
            exec_id = (
                await in_thread(
                    client.api.exec_create,
                    container,
                    list(argv),
                    stdin=True,
                    workdir=cwd,
                    user=user or "",
                    environment=self._exec_environment(env, dialect_of(client).unsets_env),
                )
            )["Id"]
            raw = await in_thread(client.api.exec_start, exec_id, socket=True)
        except engine_errors() as exc:
            raise await self._fault(exc, "could not start the shell") from exc
        sock: socket.socket = raw._sock
        sock.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=sock)
        channel = DockerChannel(exec_id, reader, writer, raw)
        self._channels = [c for c in self._channels if not c.closed] + [channel]
        return channel

    async def set_network(self, enabled: bool) -> str | None:
        """Connect the container to the engine's bridge network, or disconnect it from every
        network but ``none``; a line saying why not when the engine has no bridge."""
        container = self._require()
        try:
            return await in_thread(switch_network, docker_client(), container, enabled)
        except engine_errors() as exc:
            raise await self._fault(exc, "could not change the sandbox's network") from exc

    async def upload_tar(self, archive: bytes, dest: str, *, timeout: float = 120.0) -> None:
        """Unpack ``archive`` under ``dest`` through the engine (its members re-rooted at ``/``, so
        the engine makes ``dest`` and every missing parent; no program of the container runs)."""
        try:
            rooted = rooted_archive(archive, dest)
            await wait_for(in_thread(docker_client().api.put_archive, self._require(), "/", rooted), timeout)
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
            return await wait_for(in_thread(archive_of, docker_client(), container, paths, limit), timeout)
        except TimeoutError as exc:
            raise SandboxBroken(f"could not read {', '.join(paths)} within {timeout:g}s") from exc
        except OverLimit as exc:
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
            if (await in_thread(client.api.inspect_container, container)).get("Name", "").lstrip("/") != name:
                await in_thread(client.api.rename, container, name)  # kept before (attached, then kept again): as is
        except engine_errors() as exc:
            raise await self._fault(exc, "could not keep the container") from exc
        self._kept = True
        return {
            "backend": "docker",
            "id": name,
            "attach": f"termgym shell --attach {name} --backend docker",
            "remove": f"termgym gc --backend docker {name}",  # or docker rm -f NAME
        }
