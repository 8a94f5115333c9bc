"""The embedded backend's sandbox (``termgym.sandboxes.local`` says what it covers) once started:
commands, the process channel, the kill step, the agent's changes, the traced exec, the network
between phases, keep, and stop. Its state and start-up are ``startup``'s (``SandboxStartup``);
entering a kept one again is ``leftovers.enter_kept``.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from termgym.aio import wait_for
from termgym.errors import SandboxBroken, SandboxError
from termgym.output import OutputCapture
from termgym.sandboxes.base import (
    AGENT_SHELL,
    DEFAULT_PATH,
    ROOT,
    Command,
    ExecResult,
    ProcessChannel,
    SandboxSpec,
    agent_env,
    refuse_user,
)
from termgym.sandboxes.capabilities import fixed_network
from termgym.sandboxes.changes import entrypoint_files, leaf_changes, manifest_changes
from termgym.sandboxes.host_kit import kit_argv
from termgym.sandboxes.host_processes import (
    POLL_SEC,
    HostChannel,
    alive,
    communicate,
    descendants,
    end_detached,
    end_entered,
    end_process,
    spawn,
)
from termgym.sandboxes.local import pool
from termgym.sandboxes.local.commands import RunAs
from termgym.sandboxes.local.entrypoint import run_entrypoint
from termgym.sandboxes.local.holder import start_holder, view_path
from termgym.sandboxes.local.home import remove_home, write_labels
from termgym.sandboxes.local.host import (
    host_strace,
)
from termgym.sandboxes.local.host_files import LocalHostFiles, changes_since
from termgym.sandboxes.local.keeper import Keeper
from termgym.sandboxes.local.kept import KEPT_STATE, detach_holder, kept_state, write_json
from termgym.sandboxes.local.namespace import reach
from termgym.sandboxes.local.startup import Launch, Processes, SandboxStartup
from termgym.sandboxes.local.users import READ_SCRIPT, resolve_user, split_files
from termgym.sandboxes.tracing import TRACE_LIMIT, traced_argv

# Set while an archive call runs: its commands run as the sandbox's root whatever the image's USER.
_AS_ROOT: contextvars.ContextVar[bool] = contextvars.ContextVar("termgym_local_as_root", default=False)


class LocalSandbox(SandboxStartup):
    """The embedded backend's sandbox (the module docstring); its state and start-up are ``SandboxStartup``'s."""

    backend = "local"
    _kept_holder: tuple[int, int | None] | None = None  # without root, a kept sandbox's holder: (pid, start time)
    _kept_layers: Sequence[Path] = ()  # and the layers it mounts, top first (an attached sandbox's)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if not self._pooled:
            ready = await pool.take(self.spec, pooled_sandbox)
            if ready is not None:
                assert isinstance(ready, LocalSandbox)  # what pooled_sandbox makes
                self._adopt(ready)
                return
        await self._start()  # SandboxStartup's
        if self._user is not None:  # prepared as root; from here on, commands run as the image's USER
            self._run_as = await self._resolve_user(self._user)
            self.default_user = self._user
        if self._entrypoint:
            # what every restart runs, in the working directory the sandbox ends up with
            self.untraced_loads = (*self.untraced_loads, *entrypoint_files(self._entrypoint, self.workdir))
            await self._start_entrypoint()
            # what it wrote before the agent's first command is not the agent's
            self._baseline = await asyncio.to_thread(self._upper_manifest)
        if self._lower is None:  # what agent_changes compares against: the roots before the agent's first command
            roots = ["/" + root for root in self._roots]
            self._baseline = await asyncio.to_thread(LocalHostFiles(self.files_dir, self.owner).manifest, roots)
        if self._pooled:  # ready in full, off the trial's path: the agent's shell, and the spare keeper up
            await self._start_agent_shell()
            if self._keeper is not None:
                await self._keeper.take_spare()  # waits for it; it stays the spare

    async def _start_agent_shell(self) -> None:
        """A pooled sandbox's: the agent's shell started ahead, as an episode starts it (``AGENT_SHELL``
        with ``agent_env``, in the working directory, as the default user), so that the episode's
        reset does not wait for its process: ``open_process`` with exactly those parameters hands it
        over; another ``open_process``, a kill step or the stop ends it. bash started without a profile or
        rc file reads and writes nothing before its first line of input."""
        env = agent_env(self.env)
        channel = await self._open_process(AGENT_SHELL, env, self.workdir, None)
        self._warm_shell = (launch(AGENT_SHELL, env, self.workdir, None), channel)

    async def _resolve_user(self, user: str) -> RunAs:
        """``user`` as the root's ``/etc/passwd`` and ``/etc/group`` name it (``users.resolve_user``),
        read by the root's shell (the kit's over an image) as the sandbox's root."""
        shell = self._tool("sh", "/bin/sh")
        read = Command((*shell, "-c", READ_SCRIPT), 30.0, env={"PATH": DEFAULT_PATH}, cwd="/")
        result = await self._run(read, trace=False)
        if result.exit_code != 0:
            raise SandboxError(f"could not read the users of the sandbox's root: {result.text.strip()[-200:]}")
        return resolve_user(user, *split_files(result.text))

    async def _start_entrypoint(self) -> None:
        """The image's entrypoint, as Docker runs it at each (re)start of a container
        (``termgym.sandboxes.local.entrypoint``); ended with the agent's processes."""
        if not self._entrypoint or self._dir is None:
            return
        # the kit's over an image; over the host's system, the host's (its read-only /usr)
        sleep = self._tool("sleep", "/bin/sleep")

        def enter(argv: list[str]) -> list[str]:
            return self._enter_argv(argv, self.env, self.workdir, lasting=True)

        process, warning = await run_entrypoint(self._entrypoint, sleep, enter, self._dir / "entrypoint.log")
        self._channels.append(HostChannel(process))
        if warning is not None and warning not in self.warnings:
            self.warnings.append(warning)

    def _adopt(self, ready: LocalSandbox) -> None:
        """Become the pooled sandbox ``ready`` (started from a spec of this one's recipe): its
        directory, keeper, cgroup, file system, environment, warnings and tamper baseline; its
        directory's labels become this spec's. ``ready`` is left as an empty shell."""
        for name, value in vars(ready).items():
            if name not in ("spec", "_pooled"):
                setattr(self, name, value)
        ready._dir, ready._keeper, ready._channels, ready._mounts, ready._image_hold = None, None, [], None, None
        assert self._dir is not None
        write_labels(self._dir, self.spec.name, self.spec.labels)

    async def stop(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        if self._state is Processes.KEPT:
            return
        await self._stop_keeper()
        if self._kept_holder is not None:  # a kept sandbox's (attached, or kept and stopped): the mount too
            await asyncio.to_thread(end_detached, *self._kept_holder)
            self._kept_holder = None
        if self._cgroup is not None:
            await self._wait_cgroup_empty()
            await asyncio.to_thread(self._cgroup.remove)
            self._cgroup = None
        if self._holder is not None:  # its mount goes with it
            await end_process(self._holder)
            self._holder = None
        home, view, storage, mounts = self._dir, self._view, self._storage, self._mounts
        self._dir = self._view = self._storage = self._mounts = None
        try:
            await remove_home(home, view, storage, mounts)
        finally:
            hold, self._image_hold = self._image_hold, None
            if hold is not None:  # nothing runs over the image any more
                os.close(hold)

    async def kill_agent_processes(self) -> None:
        """End every process: the keeper, so the kernel ends its whole PID namespace. The spare
        keeper (started with the sandbox) takes over at once, else the next command starts a new
        one. Until the next command ``host_files`` reaches the files from the host."""
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        keeper = self._keeper
        if keeper is None:
            raise SandboxError("the sandbox is not running")
        spare = await keeper.take_spare() if self._state is not Processes.IDLE else None
        await self._end_keeper(keeper)
        if self._kept_holder is not None and self._state is not Processes.KEPT:
            await self._own_holder()  # an attached sandbox, no longer kept: its mount dies with this process
        cgroup = self._cgroup
        if cgroup is not None:
            spared = set() if spare is None else {spare[0].pid, *descendants(spare[0].pid)}
            if not await self._wait_until(lambda: cgroup.pids() <= spared):
                await keeper.discard_spare()
                raise SandboxError("the sandbox's processes did not all end after its keeper was killed")
        if spare is not None:
            keeper.hand_over(spare)
            self._state = Processes.QUIET
        else:
            self._state = Processes.IDLE
        if self._entrypoint:  # run again at once, as a container's restart does: before anything
            await self._before_command()  # lists or reads the files (what it changes is listed too)

    async def _before_command(self) -> None:
        """A command is about to run: the keeper started again after ``kill_agent_processes``
        ended every process; the files are no longer the host's to reach."""
        restarted = self._state in (Processes.QUIET, Processes.IDLE)
        if self._state is Processes.IDLE and self._keeper is not None:
            await self._keeper.start()
        self._state = Processes.RUNNING
        if self._network is not None:  # a new keeper (a new namespace) gets the network too
            await self._network.follow(self._keeper_pid)
        if restarted:
            await self._start_entrypoint()

    def host_files(self) -> LocalHostFiles | None:
        """The sandbox's writable roots from the host while none of the agent's processes runs
        (a keeper the agent never reached, ``sleep`` from the read-only ``/usr``, touches no file);
        never for a sandbox that runs an image's USER, whose harness steps go through it as on Docker."""
        quiet = self._state in (Processes.QUIET, Processes.IDLE) and self._run_as is None
        return LocalHostFiles(self.files_dir, self.owner) if quiet and self._dir is not None else None

    async def _wait_cgroup_empty(self, timeout: float = 5.0) -> bool:
        """True once the cgroup holds no process (the kernel reaps a dead namespace's asynchronously)."""
        cgroup = self._cgroup
        assert cgroup is not None
        return await self._wait_until(lambda: not cgroup.pids(), timeout)

    @staticmethod
    async def _wait_until(done: Callable[[], bool], timeout: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(POLL_SEC)
        return True

    async def check_alive(self) -> None:
        if self._state is Processes.IDLE:
            return  # its processes were ended by kill_agent_processes, not by the agent
        if self._keeper_pid is None or not alive(self._keeper_pid):
            raise SandboxBroken("every process of the sandbox was killed from inside (its keeper is gone)")

    async def agent_changes(self) -> dict[str, str]:
        """Every change under the writable roots since the sandbox started (the rest is the host's,
        bound read-only): over a prepared environment or an image, what its overlay's upper layer
        holds (the trial's writes, nothing else; less what this sandbox's own preparation wrote
        there, ``changes_since``); otherwise by the change times the host's files carry, which no
        process can set back. ``SandboxBroken`` when the trees grew past what can be compared."""
        if self._dir is None:
            return {}
        try:
            if (lower := self._lower) is not None:
                upper = await asyncio.to_thread(self._upper_manifest)
                changes = await asyncio.to_thread(self._overlay_changes, upper, lower)
                if self._baseline:  # prepared in this sandbox's own upper layer
                    changes = changes_since(changes, self._baseline, upper)
            else:
                roots = ["/" + root for root in self._roots]
                now = await asyncio.to_thread(LocalHostFiles(self.files_dir, self.owner).manifest, roots)
                changes = manifest_changes(self._baseline, now)
        except OSError as exc:
            raise SandboxBroken(f"could not list what the agent changed: {exc.strerror or exc}") from exc
        return leaf_changes(changes)

    async def exec_traced(self, command: Command) -> ExecResult | None:
        """Under the host's ``strace``, which the sandbox sees read-only in the host's ``/usr`` (or in
        the kit, over an image); None where the host has none or for a user other than ``ROOT``
        (which this backend refuses)."""
        if command.user not in (None, ROOT):
            return None
        if self._image_root is not None:
            tracer = kit_argv(self._image_root.kit_at, "strace")
        else:
            found = host_strace()
            if found is None:
                return None
            tracer = [found]
        return await self._run(replace(command, argv=traced_argv(tracer, command.argv)), trace=True)

    async def download_tar(self, paths: Sequence[str], *, limit: int, timeout: float = 120.0) -> bytes:
        """From the host while no process runs in the sandbox (``LocalHostFiles.archive``: bounded in
        bytes and entries, never reading a file that does not fit), else as every backend does."""
        host = self.host_files()
        if host is None:
            token = _AS_ROOT.set(True)  # as Docker's archive calls read: as root, whatever the USER
            try:
                return await super().download_tar(paths, limit=limit, timeout=timeout)
            finally:
                _AS_ROOT.reset(token)
        try:
            return await wait_for(asyncio.to_thread(host.archive, paths, limit), timeout)
        except TimeoutError as exc:
            raise SandboxBroken(f"could not read {', '.join(paths)} within {timeout:g}s") from exc
        except OSError as exc:
            raise SandboxBroken(f"could not read {', '.join(paths)}: {exc.strerror or exc}") from exc

    async def upload_tar(self, archive: bytes, dest: str, *, timeout: float = 120.0) -> None:
        """As every backend does, as the sandbox's root whatever the USER (Docker's archive calls write so)."""
        token = _AS_ROOT.set(True)
        try:
            await super().upload_tar(archive, dest, timeout=timeout)
        finally:
            _AS_ROOT.reset(token)

    async def limit_warnings(self) -> list[str]:
        warnings = self._cgroup.limit_warnings() if self._cgroup is not None else []
        if self._storage is not None and self._storage.full():
            warnings.append(f"the sandbox reached its storage limit ({self._storage.size_mb} MB)")
        return warnings

    async def set_network(self, enabled: bool) -> str | None:
        """User-mode network, nothing of the host's reachable (``termgym.sandboxes.local.network``),
        or none; a line saying why not where this host cannot give it."""
        if self._network is None:
            return fixed_network(self, enabled)
        return await self._network.set(enabled, self._keeper_pid)

    # -- the keeper: the process whose namespaces every command enters --------------------------

    async def _stop_keeper(self) -> None:
        """End the keeper and its spare."""
        if self._keeper is not None:
            await self._keeper.discard_spare()
            await self._end_keeper(self._keeper)

    async def _end_keeper(self, keeper: Keeper) -> None:
        """End the keeper (its whole namespace); a kept one's state file goes: no longer kept."""
        state = self._dir / KEPT_STATE if self._dir is not None else None
        await keeper.stop(on_detached_end=lambda: state.unlink(missing_ok=True) if state else None)
        if self._network is not None:  # its namespace is gone: pasta too
            await self._network.stop()

    # -- keeping it past this process, and entering it again -------------------------------------

    async def keep(self) -> dict[str, str]:
        """Restart the keeper detached from this process (the agent's processes end; the files
        stay) and write ``kept.json``; after it ``stop`` leaves the sandbox alone."""
        if self._dir is None:
            raise SandboxError("the sandbox is not running")
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        await self._stop_keeper()
        if self._cgroup is not None and not await self._wait_cgroup_empty():
            raise SandboxError("the sandbox's processes did not all end before its keeper was detached")
        if self._holder is not None:  # without root over an image: its root's mount, detached too
            await self._detach_holder()
        keeper = self._keeper or Keeper(self._keeper_argv, self._dir / "keeper.pid")
        await keeper.start_detached(self._dir / "keeper.log")
        self._keeper = keeper
        write_json(self._dir / KEPT_STATE, self._kept_state())
        self._state = Processes.KEPT
        name = self._dir.name
        return {
            "backend": "local",
            "id": name,
            "attach": f"termgym shell --attach {name} --backend local",
            "remove": f"termgym gc --backend local {name}",
        }

    async def _detach_holder(self) -> None:
        """End the holder (it dies with this process; its mount with it) and mount the root again
        in a detached one (``kept.detach_holder``), which the detached keeper then starts in."""
        assert self._holder is not None and self._image_root is not None and self._dir is not None
        assert self._lower is not None  # the layers the holder mounted, top first
        await end_process(self._holder)
        self._holder = None
        fs, view = self._dir / "fs", self._image_root.root
        args = (self._lower, fs / "upper", fs / "work", view, self._ids, self._dir / "holder.log")
        self._kept_holder = await asyncio.to_thread(detach_holder, *args)
        self._image_root = replace(self._image_root, holder=self._kept_holder[0])
        self._view = view_path(self._kept_holder[0], view)

    async def _own_holder(self) -> None:
        """An attached sandbox that is no longer kept (its detached keeper ended): its detached
        holder ended and the root mounted again by one that dies with this process, as at start."""
        assert self._kept_holder is not None and self._image_root is not None and self._dir is not None
        await asyncio.to_thread(end_detached, *self._kept_holder)
        self._kept_holder = None
        fs, view = self._dir / "fs", self._image_root.root
        self._holder = await start_holder(self._kept_layers, fs / "upper", fs / "work", view, self._ids)
        self._image_root = replace(self._image_root, holder=self._holder.pid)
        self._view = view_path(self._holder.pid, view)

    def _kept_state(self) -> dict:
        """What ``attach`` needs to enter this sandbox from another process (JSON)."""
        assert self._keeper is not None and self._keeper.detached is not None
        return kept_state(
            self._keeper.detached,
            self._keeper.pid,
            uid=self._uid,
            roots=self._roots,
            cgroup=self._cgroup,
            storage=self._storage,
            file_size_limit=self._file_size_limit,
            view=self._view,
            sandbox=self,
            image_root=self._image_root,
            holder=self._kept_holder,
            mapped_ids=self._ids is not None,
            layers=self._lower if self._kept_holder is not None else (),
        )

    # -- commands ----------------------------------------------------------------------------------

    async def run(self, command: Command) -> ExecResult:
        refuse_user(self, command.user)  # None: the image's USER, if any; ROOT: the sandbox's root
        return await self._run(command, trace=False)

    async def _run(self, command: Command, *, trace: bool) -> ExecResult:
        """``run``; with ``trace``, stderr kept apart (bounded by ``TRACE_LIMIT``) as the trace."""
        # The deadline ends the command's whole process group (TERM, then KILL one second later);
        # the host-side one is only a backstop if that fails.
        await self._before_command()
        limit = max(command.timeout, 0.001)
        env = self.env if command.env is None else command.env
        stdin = command.stdin
        as_root = _AS_ROOT.get() or command.user == ROOT
        process = await spawn(
            self._enter_argv(command.argv, env, command.cwd or self.workdir, as_root=as_root, deadline=limit),
            end_entered,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE if trace else asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        capture = OutputCapture(command.output_limit)
        traced = OutputCapture(TRACE_LIMIT) if trace else None
        started = time.monotonic()
        try:
            await wait_for(communicate(process, stdin, capture, traced), limit + 5.0)
        except TimeoutError:
            pass  # the in-sandbox timeout failed to end it: killed below
        finally:
            await end_entered(process)
        code = process.returncode
        if code is not None and code < 0:  # ended by signal N: 128 + N, as a shell and Docker's exec say
            code = 128 - code
        if self._keeper_pid is None or not alive(self._keeper_pid):
            raise SandboxBroken("every process of the sandbox was killed while a command ran (its keeper is gone)")
        timed_out = code in (124, 137) and time.monotonic() - started >= limit
        return ExecResult(
            exit_code=None if timed_out else code,
            output=capture.getvalue(),
            timed_out=timed_out,
            dropped_bytes=capture.dropped_bytes,
            trace=traced.getvalue() if traced is not None else None,
            trace_dropped=traced.dropped_bytes if traced is not None else 0,
        )

    async def open_process(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str, user: str | None = None
    ) -> ProcessChannel:
        refuse_user(self, user)
        warm, self._warm_shell = self._warm_shell, None
        if warm is not None:
            started, channel = warm
            if started == launch(argv, env, cwd, user) and channel.running:
                return channel
            await channel.close()
        return await self._open_process(argv, env, cwd, user)

    async def _open_process(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: str, user: str | None
    ) -> HostChannel:
        await self._before_command()
        process = await spawn(
            self._enter_argv(argv, env, cwd, lasting=True, as_root=user == ROOT),
            end_entered,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        channel = HostChannel(process)
        self._channels = [c for c in self._channels if not c.closed] + [channel]
        return channel

    @property
    def host_dir(self) -> Path | None:
        """The host directory holding the sandbox's writable file systems (for tests and gc)."""
        return self._dir

    @property
    def files_dir(self) -> Path:
        """The directory whose subdirectories are the sandbox's writable roots (``app``...), as this
        process reaches it (through the sandbox's mount namespace, where it has one)."""
        if self._dir is None:
            raise SandboxError("the sandbox is not running")
        return reach(self._mounts, self._view or self._dir / "fs")


def launch(argv: Sequence[str], env: Mapping[str, str], cwd: str, user: str | None) -> Launch:
    """What ``open_process`` starts, as a comparable value."""
    return (tuple(argv), tuple(sorted(env.items())), cwd, user)


def pooled_sandbox(spec: SandboxSpec) -> LocalSandbox:
    """A sandbox the warm pool makes (``termgym.sandboxes.local.pool``): it never takes from the pool."""
    return LocalSandbox(spec, pooled=True)
