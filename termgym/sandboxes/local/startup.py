"""How an embedded sandbox starts, and the state it keeps (``SandboxStartup``, which ``LocalSandbox``
extends with what it does once started): over the task's image, from the prepared-environment cache
(preparing and keeping the entry when there is none), or fresh on the host's system with the
Dockerfile subset run in it; then its cgroups, keeper, spare and network.

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
from collections.abc import Mapping, Sequence
from pathlib import Path

from termgym.errors import EnvironmentBuildError, SandboxBroken, SandboxError
from termgym.images.dockerfile import EnvironmentPlan, parse_dockerfile
from termgym.images.dockerfile_syntax import DockerfileError
from termgym.sandboxes.base import Sandbox, SandboxSpec
from termgym.sandboxes.host_kit import UNTRACED, kit_argv, kit_dir
from termgym.sandboxes.host_processes import HostChannel, alive
from termgym.sandboxes.limits import SandboxCgroup
from termgym.sandboxes.local.commands import (
    KIT_PROGRAMS,
    ImageRoot,
    RootEntry,
    RunAs,
    enter_argv,
    keeper_argv,
    within_limits,
)
from termgym.sandboxes.local.env_cache import Entry, EnvCache, cache_enabled, cache_root, copy_tree, environment_key
from termgym.sandboxes.local.holder import start_holder, view_path
from termgym.sandboxes.local.home import make_file_system, make_home, overlay_prepared
from termgym.sandboxes.local.host import BASE_WRITABLE, require_tools, sandbox_uid, writable_roots
from termgym.sandboxes.local.host_files import MAX_WATCHED, LocalHostFiles, overlay_changes
from termgym.sandboxes.local.images import DEFAULT_PATH, ImageStore, LocalImage, image_to_run
from termgym.sandboxes.local.keeper import Keeper
from termgym.sandboxes.local.mounts import mount_overlay
from termgym.sandboxes.local.namespace import MountNamespace, in_namespace, reach, sandbox_namespace
from termgym.sandboxes.local.network import SandboxNetwork
from termgym.sandboxes.local.prepare import prepare_environment
from termgym.sandboxes.local.storage import SizedFilesystem
from termgym.sandboxes.local.subids import SubIds, mapped_manifest, mapped_overlay_changes, subordinate_ids
from termgym.sandboxes.local.users import ROOT_USERS, USERS

# What ``open_process`` started: argv, the environment's items sorted, directory, user.
Launch = tuple[tuple[str, ...], tuple[tuple[str, str], ...], str, "str | None"]


class Processes(enum.Enum):
    """Where a sandbox's processes are (the module's docstring)."""

    RUNNING = "running"
    QUIET = "quiet"
    IDLE = "idle"
    KEPT = "kept"


class SandboxStartup(Sandbox):
    """An embedded sandbox's state and its start-up (the module docstring)."""

    def __init__(self, spec: SandboxSpec, *, pooled: bool = False) -> None:
        super().__init__(spec)
        self._pooled = pooled  # made by the warm pool (termgym.sandboxes.local.pool): never takes from it
        self._dir: Path | None = None
        self._roots: list[str] = list(BASE_WRITABLE)
        self._keeper: Keeper | None = None  # made with the sandbox's directory
        self._channels: list[HostChannel] = []
        self._warm_shell: tuple[Launch, HostChannel] | None = None  # a pooled sandbox's agent shell, started ahead
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
        self._entrypoint: tuple[str, ...] = ()  # over an image: its ENTRYPOINT (``entrypoint``)
        self._user: str | None = None  # the image's USER, honoured (as root): a user namespace of ``USERS`` ids
        self._ids: SubIds | None = None  # without root, over an image: that namespace's ids (``subids``)
        self._run_as: RunAs | None = None  # that USER resolved (``users``): who runs every command but the harness's

    # -- start-up ---------------------------------------------------------------------------------

    async def _start(self) -> None:
        require_tools()
        self.image = {"source": "host"}  # the host's system, unless the task's image is another
        plan = self._plan()
        ref, source = image_to_run(self.spec, plan, ImageStore.from_environment())
        if ref is not None:  # the Dockerfile's steps run on its FROM, not on a named image that wins over it
            await self._start_image(ref, source, plan if source == "build" else None)
            return
        if plan is not None and source == "build" and plan.entrypoint:  # the host's system has none of its own
            self._entrypoint = plan.entrypoint
        self._roots = writable_roots(plan)
        self._take_user(plan.user if plan is not None else None, image=False)
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
            await cache.publish(
                key, source, owner=self.owner, roots=kept, env=self.env, workdir=self.workdir, ids=self._ids
            )
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
        # the Dockerfile's own ENTRYPOINT replaces the image's (``ENTRYPOINT []`` clears it), as on Docker
        entrypoint = plan.entrypoint if plan is not None else None
        self._entrypoint = image.config.entrypoint if entrypoint is None else entrypoint
        user = plan.user if plan is not None and plan.user else image.config.user  # a FROM's is inherited
        self._take_user(user, image=True)
        self._roots = []
        self._uid = image.owner if os.geteuid() == 0 else None
        layers = [image.rootfs]
        if plan is not None and plan.steps and cache_enabled() and self.spec.dockerfile is not None:
            cache = EnvCache.from_environment()
            env = {**self.env, **dict(self.spec.env)}
            rootless = "" if os.geteuid() == 0 else " rootless"  # its overlay marks whiteouts in user. attributes
            rootless += f" ids {self._ids.key}" if self._ids is not None else ""  # its files' host owners
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
            self._holder = await start_holder(layers, upper, work, view, self._ids)
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

    def _take_user(self, user: str | None, *, image: bool) -> None:
        """Run as the image's ``user`` (resolved once the sandbox is prepared, ``LocalSandbox.start``):
        as root, in a user namespace of ``USERS`` ids; without root, over an ``image``, in the holder's,
        mapped to this user's subordinate ids (``subids``); else a warning (one host uid, one id)."""
        if user is None or user in ROOT_USERS:
            return
        self._ids = subordinate_ids() if image and os.geteuid() != 0 else None
        if os.geteuid() == 0 or self._ids is not None:
            self._user = user
            return
        why = "over the host's system" if not image else "this user has no 65535 subordinate ids it can map"
        self.warnings.append(
            f"USER {user} ignored: without root the embedded backend runs every command as root ({why})"
        )

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
        if self.spec.network and (reason := await self._network.set(True, self._keeper_pid)) is not None:
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

    def _keeper_argv(self, detached: bool) -> list[str]:
        assert self._dir is not None  # a keeper is started for a sandbox with its directory
        # as its mount namespace sees them
        mapped = self._user is not None
        files = self._view or self._dir / "fs"
        argv = keeper_argv(files, self._roots, detached=detached, image=self._image_root, mapped=mapped)
        namespace = self._mounts.path if self._mounts is not None else None
        users = USERS if mapped and self._ids is None else None  # without root the holder's namespace maps them
        return self._within_limits(argv, mount_namespace=namespace, uid=self._uid, users=users)

    def _enter_argv(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: str,
        *,
        lasting: bool = False,
        as_root: bool = False,
        deadline: float | None = None,
    ) -> list[str]:
        """``argv`` run in the sandbox as its root, within its limits: as root, entered by the guard
        itself (``commands.RootEntry``), or by ``nsenter`` for a ``lasting`` command (a persistent
        shell: the ``nsenter`` that waits for it holds a fifth of the guard's memory, which counts
        with a thousand sandboxes alive); without root through ``commands.enter_argv``. As the
        image's USER where the sandbox runs one, unless ``as_root``. With a ``deadline`` (seconds)
        ended as ``timeout -k 1 DEADLINE`` ends a command: by the guard where it enters, else by that
        program inside the sandbox."""
        if self._keeper_pid is None:
            raise SandboxError("the sandbox is not running")
        if not alive(self._keeper_pid):
            raise SandboxBroken("every process of the sandbox was killed from inside (its keeper is gone)")
        root, user = os.geteuid() == 0, None if as_root else self._run_as
        if root and not lasting:
            return self._within_limits(list(argv), RootEntry(self._keeper_pid, cwd, env, user, deadline))
        if deadline is not None:
            argv = [*self._tool("timeout", "/usr/bin/timeout"), "-k", "1", f"{deadline:.3f}", *argv]
        kit_at = self._image_root.kit_at if self._image_root is not None else None
        # without root, a sandbox of many ids is entered as root enters: its user namespace is the holder's, this user's
        privileged = root or self._ids is not None
        entered = enter_argv(self._keeper_pid, argv, env, cwd, kit_at=kit_at, privileged=privileged, user=user)
        return self._within_limits(entered)

    def _tool(self, name: str, host_path: str) -> list[str]:
        """The harness's program ``name`` as a command runs it in the sandbox: the host's kit's over
        an image (``host_kit``), else the host's own at ``host_path`` (its read-only ``/usr``)."""
        return kit_argv(self._image_root.kit_at, name) if self._image_root is not None else [host_path]

    def _within_limits(
        self,
        argv: list[str],
        entry: RootEntry | None = None,
        *,
        mount_namespace: str | None = None,
        uid: int | None = None,
        users: int | None = None,
    ) -> list[str]:
        joins = self._cgroup.join_files if self._cgroup is not None else ()
        limit = self._file_size_limit
        return within_limits(argv, joins, limit, entry, mount_namespace=mount_namespace, uid=uid, users=users)

    @property
    def _keeper_pid(self) -> int | None:
        return self._keeper.pid if self._keeper is not None else None

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
        if self._ids is not None:  # its user's files: read as their namespace's root
            manifest = mapped_manifest(self._ids, upper_dir, self.owner, roots, MAX_WATCHED)
        else:
            manifest = LocalHostFiles(upper_dir, self.owner).manifest(roots)
        return {path: entry for path, entry in manifest.items() if path not in mounted}

    def _overlay_changes(self, upper: dict[str, tuple[int, ...]], lower: list[Path]) -> dict[str, str]:
        """``host_files.overlay_changes``; with a USER's ids, looked up as their namespace's root (a
        prepared layer's directory of the range may be one only its owner enters). Blocking."""
        if self._ids is not None:
            return mapped_overlay_changes(self._ids, upper, lower)
        return overlay_changes(upper, lower)

    def _plan(self) -> EnvironmentPlan | None:
        if self.spec.dockerfile is None:
            return None
        try:
            return parse_dockerfile(self.spec.dockerfile.read_text(encoding="utf-8", errors="replace"))
        except DockerfileError as exc:
            raise EnvironmentBuildError(f"{self.spec.dockerfile}: {exc}") from exc


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
