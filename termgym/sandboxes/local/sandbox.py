"""The embedded backend's sandbox (``termgym.sandboxes.local`` says what it covers): start-up,
from the prepared-environment cache or fresh, the keeper and its spare, commands, the kill step,
keep and attach, and stop.

Where its processes are is one state (``Processes``): ``RUNNING`` (commands may run), ``QUIET``
(every process ended and a keeper nobody entered took over), ``IDLE`` (every process ended, no
keeper: the next command starts one), ``KEPT`` (left running past this process: ``stop`` leaves it
alone). Only in ``QUIET`` and ``IDLE`` are its files the host's to reach (``host_files``).
"""

from __future__ import annotations

import asyncio
import enum
import os
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from termgym.aio import wait_for
from termgym.errors import EnvironmentBuildError, SandboxBroken, SandboxError
from termgym.images.dockerfile import DockerfileError, EnvironmentPlan, parse_dockerfile
from termgym.output import OutputCapture
from termgym.sandboxes.base import Command, ExecResult, ProcessChannel, Resources, Sandbox, SandboxSpec, refuse_user
from termgym.sandboxes.capabilities import fixed_network
from termgym.sandboxes.changes import leaf_changes, manifest_changes
from termgym.sandboxes.host_kit import UNTRACED, kit_argv, kit_dir
from termgym.sandboxes.host_processes import (
    POLL_SEC,
    HostChannel,
    alive,
    children,
    communicate,
    end_entered,
    end_process,
    spawn,
)
from termgym.sandboxes.limits import SandboxCgroup
from termgym.sandboxes.local import pool
from termgym.sandboxes.local.commands import KIT_PROGRAMS, ImageRoot, RootEntry, enter_argv, keeper_argv, within_limits
from termgym.sandboxes.local.env_cache import Entry, EnvCache, cache_enabled, cache_root, copy_tree, environment_key
from termgym.sandboxes.local.holder import start_holder, view_path
from termgym.sandboxes.local.home import make_file_system, make_home, overlay_prepared, remove_home, write_labels
from termgym.sandboxes.local.host import (
    BASE_WRITABLE,
    host_strace,
    require_tools,
    sandbox_uid,
    writable_roots,
)
from termgym.sandboxes.local.host_files import LocalHostFiles, changes_since, overlay_changes
from termgym.sandboxes.local.images import DEFAULT_PATH, ImageStore, LocalImage, image_to_run
from termgym.sandboxes.local.keeper import Keeper
from termgym.sandboxes.local.kept import KEPT_STATE, kept_state, write_json
from termgym.sandboxes.local.mounts import mount_overlay
from termgym.sandboxes.local.namespace import MountNamespace, in_namespace, reach, sandbox_namespace
from termgym.sandboxes.local.network import SandboxNetwork
from termgym.sandboxes.local.prepare import prepare_environment
from termgym.sandboxes.local.storage import SizedFilesystem
from termgym.sandboxes.tracing import TRACE_LIMIT, traced_argv


class Processes(enum.Enum):
    """Where a sandbox's processes are (the module's docstring)."""

    RUNNING = "running"
    QUIET = "quiet"
    IDLE = "idle"
    KEPT = "kept"


class LocalSandbox(Sandbox):
    backend = "local"

    def __init__(self, spec: SandboxSpec, *, pooled: bool = False) -> None:
        super().__init__(spec)
        self._pooled = pooled  # made by the warm pool (termgym.sandboxes.local.pool): never takes from it
        self._dir: Path | None = None
        self._roots: list[str] = list(BASE_WRITABLE)
        self._keeper: Keeper | None = None  # made with the sandbox's directory
        self._channels: list[HostChannel] = []
        self._uid: int | None = None  # the sandbox's root on the host; None: this process's user
        self._cgroup: SandboxCgroup | None = None
        self._storage: SizedFilesystem | None = None
        self._file_size_limit: int | None = None  # bytes a file, where no sized file system is mounted
        self._view: Path | None = None  # the overlay over a prepared environment, when started from one
        self._state = Processes.RUNNING
        self._baseline: dict[str, tuple[int, ...]] = {}  # the writable roots as the agent found them
        self._network: SandboxNetwork | None = None  # user-mode network (made with the keeper)
        self._lower: list[Path] | None = None  # the overlay's lower layers, when the roots are an overlay
        self._image_root: ImageRoot | None = None  # the whole root, when the sandbox runs an image
        self._holder: asyncio.subprocess.Process | None = None  # without root: the image root's mount (``holder``)
        self._mounts: MountNamespace | None = None  # where its storage and overlay are mounted (as root)
        self._image_hold: int | None = None  # over an image: its use lock, held shared (``ImageStore.hold``)

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        if not self._pooled:
            ready = await pool.take(self.spec, pooled_sandbox)
            if ready is not None:
                assert isinstance(ready, LocalSandbox)  # what pooled_sandbox makes
                self._adopt(ready)
                return
        await self._start()
        if self._lower is None:  # what agent_changes compares against: the roots before the agent's first command
            roots = ["/" + root for root in self._roots]
            self._baseline = await asyncio.to_thread(LocalHostFiles(self.files_dir, self.owner).manifest, roots)

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

    async def _start(self) -> None:
        require_tools()
        self.image = {"source": "host"}  # the host's system, unless the task's image is another
        plan = self._plan()
        ref, source = image_to_run(self.spec, plan, ImageStore.from_environment())
        if ref is not None:  # the Dockerfile's steps run on its FROM, not on a named image that wins over it
            await self._start_image(ref, source, plan if source == "build" else None)
            return
        self._roots = writable_roots(plan)
        if plan is not None and plan.user not in (None, "root", "0"):
            self.warnings.append(f"USER {plan.user} ignored: the embedded backend runs as root")
        if plan is None or not plan.steps or not cache_enabled() or self.spec.dockerfile is None:
            await self._start_fresh(plan)
            return
        try:
            if await self._start_cached(plan, EnvCache.from_environment()):
                return
        except (OSError, TimeoutError) as exc:  # the cache's own files, or its lock held too long
            if self._dir is not None:
                raise SandboxError(f"starting from the prepared-environment cache failed: {exc}") from exc
            self.warnings.append(f"the prepared-environment cache was not used: {exc}")
        await self._start_fresh(plan)

    async def _start_cached(self, plan: EnvironmentPlan, cache: EnvCache) -> bool:
        """Start from the prepared environment, preparing and keeping it when there is none; False
        (nothing started) when the entry there is one this sandbox cannot use."""
        assert self.spec.dockerfile is not None
        env = {**self.env, **dict(self.spec.env)}
        key = environment_key(self.spec.dockerfile.read_bytes(), self.spec.context_dir, env, self._roots)
        timeout = self.spec.build_timeout_sec
        for _ in range(2):  # a second time when another trial prepared it while this one waited
            async with cache.holding(key, timeout) as entry:
                if entry is not None:
                    if not self._can_start_from(entry):
                        return False
                    await self._start_from(entry)
                    return True
            async with cache.building(key, timeout) as entry:
                if entry is None:
                    await self._start_fresh(plan)
                    await self._publish(cache, key)
                    return True
        return False

    async def _publish(self, cache: EnvCache, key: str, roots: Sequence[str] | None = None) -> None:
        """Keep this freshly prepared sandbox's ``roots`` (its writable roots by default) as the
        entry ``key``; a warning if it cannot."""
        assert self._dir is not None
        kept = self._roots if roots is None else roots
        try:
            source = reach(self._mounts, self._dir / "fs")
            await cache.publish(key, source, owner=self.owner, roots=kept, env=self.env, workdir=self.workdir)
        except OSError as exc:
            self.warnings.append(f"the prepared environment was not kept for later trials: {exc}")

    @staticmethod
    def _can_start_from(entry: Entry) -> bool:
        """Only as the entry's owner: as root, any entry; otherwise one this user prepared."""
        return os.geteuid() == 0 or entry.owner == os.getuid()

    async def _start_fresh(self, plan: EnvironmentPlan | None) -> None:
        """Start an empty sandbox, then run the Dockerfile subset in it."""
        self._uid = sandbox_uid()
        self._make_home()
        await self._make_file_system([*self._roots, "var/tmp"])
        await self._start_processes()
        if plan is not None:
            await prepare_environment(self, plan, self.spec)

    async def _start_from(self, entry: Entry) -> None:
        """Start a sandbox whose writable roots begin as the prepared ``entry``: an overlay over
        it (what the trial writes lands on its own storage; the entry never changes), or a copy
        where no overlay can be mounted (not root)."""
        self._uid = entry.owner if os.geteuid() == 0 else None
        home = self._make_home()
        if os.geteuid() == 0:
            await self._make_file_system(["upper", "work"])
            self._view = overlay_prepared(home, entry, self.warnings, self._mounts)
            self._lower = [entry.tree] if self._view is not None else None
        else:
            await self._make_file_system([])
        if self._view is None and not await copy_tree(entry.tree, reach(self._mounts, home / "fs")):
            raise SandboxError(f"could not copy the prepared environment {entry.path}")
        self.env = {**self.env, **entry.env}
        self.workdir = entry.workdir
        self.image = {**self.image, "prepared": entry.key[:16]}
        await self._start_processes()

    async def _start_image(self, ref: str, source: str, plan: EnvironmentPlan | None) -> None:
        """Start over the image ``ref`` (``images``): its root file system under an overlay whose
        upper layer is the sandbox's own storage, the Dockerfile's other steps prepared on top once
        per content hash (``env_cache``, as over the host's system) and the kit bound read-only."""
        timeout = self.spec.build_timeout_sec
        store = ImageStore.from_environment()
        for _ in range(3):  # again if it was evicted between its resolution and the hold
            image = await store.resolve(ref, policy=self.spec.pull, what=self.spec.name, timeout=timeout)
            if (hold := await asyncio.to_thread(store.hold, image)) is not None:
                break
        else:
            raise SandboxError(f"image {ref} was removed each time it was resolved (another process's eviction)")
        self._image_hold = hold
        kit = await asyncio.to_thread(kit_dir, cache_root(), KIT_PROGRAMS)
        if kit is None:
            raise SandboxError(f"the host lacks one of {', '.join(KIT_PROGRAMS)}, which a sandbox over an image runs")
        self.image = image.record(source)
        self.env = {"PATH": DEFAULT_PATH, **image.config.env}
        self.workdir = image.config.workdir
        if plan is not None and plan.user not in (None, "root", "0"):
            self.warnings.append(f"USER {plan.user} ignored: the embedded backend runs as root")
        elif plan is None and image.config.user not in ("", "root", "0"):
            self.warnings.append(f"the image's user {image.config.user} ignored: the embedded backend runs as root")
        self._roots = []
        self._uid = image.owner if os.geteuid() == 0 else None
        layers = [image.rootfs]
        if plan is not None and plan.steps and cache_enabled() and self.spec.dockerfile is not None:
            cache = EnvCache.from_environment()
            env = {**self.env, **dict(self.spec.env)}
            rootless = "" if os.geteuid() == 0 else " rootless"  # its overlay marks whiteouts in user. attributes
            key = environment_key(
                self.spec.dockerfile.read_bytes(), self.spec.context_dir, env, [], base=image.digest + rootless
            )
            async with cache.holding(key, timeout) as entry:
                if entry is not None:
                    return await self._start_on_entry(image, kit, entry)
            async with cache.building(key, timeout) as entry:
                if entry is not None:  # prepared meanwhile by another trial
                    return await self._start_on_entry(image, kit, entry)
                await self._start_on_layers(image, kit, layers)
                await self._prepare_in_upper(plan)
                await self._publish(cache, key, ["upper"])  # the preparation's own layer
                return
        await self._start_on_layers(image, kit, layers)
        if plan is not None:
            await self._prepare_in_upper(plan)

    async def _start_on_entry(self, image: LocalImage, kit: Path, entry: Entry) -> None:
        """Start over the image with the prepared ``entry``'s layer on it."""
        await self._start_on_layers(image, kit, [entry.tree / "upper", image.rootfs], entry)
        self.env, self.workdir = {**self.env, **entry.env}, entry.workdir
        self.image = {**self.image, "prepared": entry.key[:16]}

    async def _prepare_in_upper(self, plan: EnvironmentPlan) -> None:
        """Run ``plan`` in this sandbox's own upper layer, then note that layer as the agent finds
        it (``agent_changes`` leaves the preparation's writes out)."""
        await prepare_environment(self, plan, self.spec)
        self._baseline = await asyncio.to_thread(self._upper_manifest)

    async def _start_on_layers(
        self, image: LocalImage, kit: Path, layers: list[Path], prepared: Entry | None = None
    ) -> None:
        """The sandbox's home, storage, overlay root over ``layers`` (top first; ``prepared``, the
        cache entry among them, held while the sandbox lives) and processes."""
        home = self._make_home()
        await self._make_file_system(["upper", "work"])
        upper, work, view = home / "fs" / "upper", home / "fs" / "work", home / "root"
        view.mkdir()
        holder = None
        if os.geteuid() == 0:
            try:
                await asyncio.to_thread(in_namespace, self._mounts, mount_overlay, layers, upper, work, view)
                if prepared is not None and self._mounts is not None:
                    self._mounts.hold(prepared.lock)
            except OSError as exc:
                view.rmdir()
                raise SandboxError(f"could not mount the root of image {image.ref}: {exc}") from exc
            self._view = view
        else:  # in a mount namespace of this user's own (``holder``), reached through /proc
            self._holder = await start_holder(layers, upper, work, view)
            holder = self._holder.pid
            self._view = view_path(holder, view)
        self._lower = layers
        # the working directory the image names, made where it lacks it (as a container engine does)
        root_dir = self._view if holder is not None else reach(self._mounts, view)
        await asyncio.to_thread(LocalHostFiles(root_dir, self.owner).make_missing_dirs, self.workdir)
        kit_at, resolv = f"/.termgym-{secrets.token_hex(8)}", await _resolver_copy(home)
        self._image_root = ImageRoot(view, kit, kit_at, resolv, holder)
        self.untraced_loads = UNTRACED  # what the kit's loader reads from the root before any trace
        await self._start_processes()
        # what bubblewrap made there (the mount points an image lacks) is not the agent's
        self._baseline = await asyncio.to_thread(self._upper_manifest)

    def _make_home(self) -> Path:
        self._dir = make_home(self.spec.name, self.spec.labels, private_user=self._uid is not None)
        self._mounts = sandbox_namespace(self._dir)
        return self._dir

    async def _start_processes(self) -> None:
        """The sandbox's cgroups and its keeper; the environment the task asks for."""
        assert self._dir is not None
        self._cgroup, warnings = SandboxCgroup.create(f"termgym-{self._dir.name}", self.spec.resources)
        self.warnings += warnings
        self._keeper = Keeper(self._keeper_argv, self._dir / "keeper.pid")
        self._network = SandboxNetwork(self._dir, self.owner)
        await self._keeper.start()
        if self.spec.network and (reason := await self.set_network(True)) is not None:
            self.warnings.append(reason)
        self._keeper.start_spare()
        self.env = {**self.env, **dict(self.spec.env)}

    async def _make_file_system(self, directories: list[str]) -> None:
        assert self._dir is not None
        resources = self.spec.resources
        made = await make_file_system(self._dir, resources, self.owner, directories, self.warnings, self._mounts)
        self._storage, self._file_size_limit = made

    @property
    def owner(self) -> int:
        """The host uid (and gid) that is root inside the sandbox."""
        return self._uid if self._uid is not None else os.getuid()

    async def stop(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        if self._state is Processes.KEPT:
            return
        await self._stop_keeper()
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
        cgroup = self._cgroup
        if cgroup is not None:
            spared = set() if spare is None else {spare[0].pid, *_descendants(spare[0].pid)}
            if not await self._wait_until(lambda: cgroup.pids() <= spared):
                await keeper.discard_spare()
                raise SandboxError("the sandbox's processes did not all end after its keeper was killed")
        if spare is not None:
            keeper.hand_over(spare)
            self._state = Processes.QUIET
        else:
            self._state = Processes.IDLE

    async def _before_command(self) -> None:
        """A command is about to run: the keeper started again after ``kill_agent_processes``
        ended every process; the files are no longer the host's to reach."""
        if self._state is Processes.IDLE and self._keeper is not None:
            await self._keeper.start()
        self._state = Processes.RUNNING
        if self._network is not None:  # a new keeper (a new namespace) gets the network too
            await self._network.follow(self._keeper_pid)

    def host_files(self) -> LocalHostFiles | None:
        """The sandbox's writable roots from the host while none of the agent's processes runs
        (a keeper the agent never reached, ``sleep`` from the read-only ``/usr``, touches no file)."""
        quiet = self._state in (Processes.QUIET, Processes.IDLE)
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
                changes = overlay_changes(upper, lower)
                if self._baseline:  # prepared in this sandbox's own upper layer
                    changes = changes_since(changes, self._baseline, upper)
            else:
                roots = ["/" + root for root in self._roots]
                now = await asyncio.to_thread(LocalHostFiles(self.files_dir, self.owner).manifest, roots)
                changes = manifest_changes(self._baseline, now)
        except OSError as exc:
            raise SandboxBroken(f"could not list what the agent changed: {exc.strerror or exc}") from exc
        return leaf_changes(changes)

    def _upper_manifest(self) -> dict[str, tuple[int, ...]]:
        """The overlay's upper layer (``LocalHostFiles.manifest``): under the writable roots, or,
        over an image, under every top-level entry but the kit's mount point. Blocking."""
        assert self._dir is not None
        upper_dir = reach(self._mounts, self._dir / "fs" / "upper")
        roots = ["/" + root for root in self._roots]
        mounted: tuple[str, ...] = ()  # bubblewrap's, bound read-only over what is there
        if self._image_root is not None:
            mounted = self._image_root.mount_points
            roots = ["/" + name for name in sorted(os.listdir(upper_dir)) if "/" + name not in mounted]
        manifest = LocalHostFiles(upper_dir, self.owner).manifest(roots)
        return {path: entry for path, entry in manifest.items() if path not in mounted}

    async def exec_traced(self, command: Command) -> ExecResult | None:
        """Under the host's ``strace``, which the sandbox sees read-only in the host's ``/usr`` (or in
        the kit, over an image); None where the host has none or for another user (this backend
        runs everything as root)."""
        if command.user is not None:
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
            return await super().download_tar(paths, limit=limit, timeout=timeout)
        try:
            return await wait_for(asyncio.to_thread(host.archive, paths, limit), timeout)
        except TimeoutError as exc:
            raise SandboxBroken(f"could not read {', '.join(paths)} within {timeout:g}s") from exc
        except OSError as exc:
            raise SandboxBroken(f"could not read {', '.join(paths)}: {exc.strerror or exc}") from exc

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

    def _plan(self) -> EnvironmentPlan | None:
        if self.spec.dockerfile is None:
            return None
        try:
            return parse_dockerfile(self.spec.dockerfile.read_text(encoding="utf-8", errors="replace"))
        except DockerfileError as exc:
            raise EnvironmentBuildError(f"{self.spec.dockerfile}: {exc}") from exc

    # -- the keeper: the process whose namespaces every command enters --------------------------

    def _keeper_argv(self, detached: bool) -> list[str]:
        assert self._dir is not None  # a keeper is started for a sandbox with its directory
        # as its mount namespace sees them
        argv = keeper_argv(self._view or self._dir / "fs", self._roots, detached=detached, image=self._image_root)
        namespace = self._mounts.path if self._mounts is not None else None
        return self._within_limits(argv, mount_namespace=namespace, uid=self._uid)

    def _within_limits(
        self,
        argv: list[str],
        entry: RootEntry | None = None,
        *,
        mount_namespace: str | None = None,
        uid: int | None = None,
    ) -> list[str]:
        procs = self._cgroup.procs_files if self._cgroup is not None else ()
        return within_limits(argv, procs, self._file_size_limit, entry, mount_namespace=mount_namespace, uid=uid)

    @property
    def _keeper_pid(self) -> int | None:
        return self._keeper.pid if self._keeper is not None else None

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
        if self._holder is not None:
            raise SandboxError(
                "a sandbox over an image is kept only when termgym runs as root (its root's mount ends with termgym)"
            )
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        await self._stop_keeper()
        if self._cgroup is not None and not await self._wait_cgroup_empty():
            raise SandboxError("the sandbox's processes did not all end before its keeper was detached")
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
        )

    @classmethod
    def from_kept(cls, directory: Path, state: dict) -> LocalSandbox:
        """A started sandbox entering the kept one in ``directory`` (``state``: its ``kept.json``)."""
        spec = SandboxSpec(
            name=state["name"],
            context_dir=None,
            dockerfile=None,
            resources=Resources(**state["resources"]),
            labels=state.get("labels") or {},
        )
        sandbox = cls(spec)
        sandbox._dir = directory
        sandbox._roots = list(state["roots"])
        sandbox._uid = state["uid"]
        sandbox._keeper = Keeper(sandbox._keeper_argv, directory / "keeper.pid")
        sandbox._keeper.attach((int(state["bwrap"][0]), state["bwrap"][1]), int(state["keeper"]))
        if state.get("cgroup"):
            dirs = {c: (int(v), Path(d)) for c, (v, d) in state["cgroup"].items()}
            sandbox._cgroup = SandboxCgroup(dirs, spec.resources)
        try:
            sandbox._mounts = MountNamespace.join(directory, int(state["bwrap"][0]))
        except OSError as exc:
            raise SandboxError(f"could not enter the kept sandbox's mount namespace: {exc}") from exc
        if state.get("storage"):
            image = state["storage"]["image"]
            size_mb = state["storage"]["size_mb"]
            sandbox._storage = SizedFilesystem(image and Path(image), directory / "fs", size_mb, sandbox._mounts)
        sandbox._file_size_limit = state.get("file_size_limit")
        sandbox._view = Path(state["view"]) if state.get("view") else None
        if state.get("image_root"):
            root = state["image_root"]
            resolv = Path(root["resolv"]) if root.get("resolv") else None
            sandbox._image_root = ImageRoot(Path(root["root"]), Path(root["kit"]), root["kit_at"], resolv)
        sandbox.env = dict(state["env"])
        sandbox.workdir = state["workdir"]
        sandbox.image = dict(state.get("image") or {})
        return sandbox

    def _enter_argv(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, *, lasting: bool = False) -> list[str]:
        """``argv`` run in the sandbox as its root, within its limits: as root, entered by the guard
        itself (``commands.RootEntry``), or by ``nsenter`` for a ``lasting`` command (a persistent
        shell: the ``nsenter`` that waits for it holds a fifth of the guard's memory, which counts
        with a thousand sandboxes alive); without root through ``commands.enter_argv``."""
        if self._keeper_pid is None:
            raise SandboxError("the sandbox is not running")
        if not alive(self._keeper_pid):
            raise SandboxBroken("every process of the sandbox was killed from inside (its keeper is gone)")
        root = os.geteuid() == 0
        if root and not lasting:
            return self._within_limits(list(argv), RootEntry(self._keeper_pid, cwd, env))
        kit_at = self._image_root.kit_at if self._image_root is not None else None
        return self._within_limits(enter_argv(self._keeper_pid, argv, env, cwd, kit_at=kit_at, privileged=root))

    # -- commands ----------------------------------------------------------------------------------

    async def run(self, command: Command) -> ExecResult:
        refuse_user(self, command.user)
        return await self._run(command, trace=False)

    async def _run(self, command: Command, *, trace: bool) -> ExecResult:
        """``run``; with ``trace``, stderr kept apart (bounded by ``TRACE_LIMIT``) as the trace."""
        # `timeout` inside the sandbox kills the command's whole process group (TERM, then KILL
        # one second later); the host-side deadline is only a backstop if that fails.
        await self._before_command()
        limit = max(command.timeout, 0.001)
        timeout_tool = kit_argv(self._image_root.kit_at, "timeout") if self._image_root else ["/usr/bin/timeout"]
        inner = [*timeout_tool, "-k", "1", f"{limit:.3f}", *command.argv]
        env = self.env if command.env is None else command.env
        stdin = command.stdin
        process = await spawn(
            self._enter_argv(inner, env, command.cwd or self.workdir),
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
        if self._keeper_pid is None or not alive(self._keeper_pid):
            raise SandboxBroken("every process of the sandbox was killed while a command ran (its keeper is gone)")
        timed_out = code in (124, 137, -9) and time.monotonic() - started >= limit
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
        await self._before_command()
        process = await spawn(
            self._enter_argv(argv, env, cwd, lasting=True),
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


async def _resolver_copy(home: Path) -> Path | None:
    """A copy of the host's ``/etc/resolv.conf`` in the sandbox's ``home``, for its user-mode
    network (an image's own is often empty, as Docker writes one into every container); None where
    the host has none."""

    def copy() -> Path | None:
        try:
            data = Path("/etc/resolv.conf").read_bytes()
        except OSError:
            return None
        target = home / "resolv.conf"
        target.write_bytes(data)
        target.chmod(0o644)
        return target

    return await asyncio.to_thread(copy)


def _descendants(pid: int) -> list[int]:
    found, queue = [], [pid]
    while queue:
        for child in children(queue.pop()):
            found.append(child)
            queue.append(child)
    return found


def pooled_sandbox(spec: SandboxSpec) -> LocalSandbox:
    """A sandbox the warm pool makes (``termgym.sandboxes.local.pool``): it never takes from the pool."""
    return LocalSandbox(spec, pooled=True)
