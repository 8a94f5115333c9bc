"""The embedded backend: a bubblewrap sandbox on this machine, no daemon, no image, no network.

What it covers:
- **An unprivileged sandbox.** Root inside is never root outside: when termgym runs as root, the
  sandbox's root is a dedicated unprivileged host uid (one of ``SANDBOX_UID_COUNT`` from
  ``SANDBOX_UID_BASE``, ``TERMGYM_SANDBOX_UID_BASE`` overrides); otherwise it is the user running
  termgym. The host's ``/usr`` and ``/etc`` are read-only binds that cannot be remounted (they are
  locked to the user namespace that made them), host files only root may read stay unreadable,
  ``/proc/sys`` is read-only, the root directory is read-only, and no nested user namespace can be
  made. Commands entered later get Docker's default capabilities in the sandbox's namespaces, not
  all of them, and every host program termgym runs is found by absolute path in root-owned system
  directories (``termgym.sandboxes.tools``). The same holds when termgym does not run as root.
- **Limits.** Memory (no swap), processes (``PIDS_LIMIT``) and CPU through cgroups
  (``termgym.sandboxes.limits``, v2 or v1); storage as a file system of the task's size holding
  every writable directory (``termgym.sandboxes.storage``; root only), else a per-file size limit.
  A limit that cannot be enforced here is a warning in the record, and so is a limit reached.
- **Private writable directories** for ``/app``, ``/tmp``, ``/root``, ``/home``, ``/opt``, ``/var``,
  ``/logs``, ``/tests``, ``/solution`` and every other top-level path the task's Dockerfile uses;
  fresh PID, network, IPC and UTS namespaces (no network at all, only a private loopback), a 64 MB
  ``/dev/shm``. The sandbox is one long-lived namespace "keeper" process started with
  ``--die-with-parent``: when the termgym process dies, for whatever reason, the kernel kills every
  process in the sandbox. Every command enters the keeper's namespaces with ``nsenter``.

**Keeping a sandbox** (``--keep``, ``keep``) restarts its keeper without ``--die-with-parent``, in
a session of its own and no child of this process, so the sandbox outlives termgym; the agent's
processes end then (the files stay). ``kept.json`` in its host directory says how to enter it again
(``attach``: the keeper's pid and start time, against pid reuse, its cgroups, storage, environment);
``termgym gc`` removes kept sandboxes too, as it does those killed runs left.

Killing the agent's processes restarts the keeper: the kernel kills every process of a PID
namespace when its first process dies, so nothing survives, whatever it forked or however it
detached (with cgroups, their process list confirms it). The files stay, since they live outside.

What it does not cover: a seccomp filter (the sandbox can make any system call its capabilities
allow, so a kernel bug is an escape; use ``--backend docker``); the environment is prepared by
running the Dockerfile's ``WORKDIR``, ``ENV``, ``COPY``/``ADD`` and ``RUN`` steps against the host's
tools, so a ``RUN`` that needs packages the host lacks fails and says to use ``--backend docker``;
``FROM`` is ignored. Host files others may read (``/etc/passwd``, the host's programs) are visible,
owned by ``nobody`` as the sandbox sees them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import secrets
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from termgym.aio import uninterrupted, wait_for
from termgym.errors import BackendUnavailable, ConfigError, EnvironmentBuildError, SandboxBroken, SandboxError
from termgym.images.dockerfile import CopyStep, DockerfileError, EnvironmentPlan, WorkdirStep, parse_dockerfile
from termgym.output import DEFAULT_OUTPUT_LIMIT, OutputCapture
from termgym.sandboxes.base import ExecResult, ProcessChannel, Resources, Sandbox, SandboxSpec
from termgym.sandboxes.changes import LINKED_DIRECTORIES, link_exits
from termgym.sandboxes.env_cache import Entry, EnvCache, cache_enabled, copy_tree, environment_key
from termgym.sandboxes.host_files import HostFiles
from termgym.sandboxes.host_processes import (
    HOST_ENV,
    POLL_SEC,
    HostChannel,
    alive,
    children,
    communicate,
    end_detached,
    end_entered,
    end_keeper,
    read_stderr,
    same_process,
    spawn,
    start_detached,
    start_time,
)
from termgym.sandboxes.host_trees import remove_path
from termgym.sandboxes.limits import SandboxCgroup, remove_stale
from termgym.sandboxes.mounts import mount_overlay, unmount
from termgym.sandboxes.prepare import prepare_environment
from termgym.sandboxes.storage import SizedFilesystem, is_mounted, unmount_sync
from termgym.sandboxes.tools import host_tool

BASE_WRITABLE = ("app", "tmp", "root", "home", "opt", "srv", "mnt", "var", "run", "logs", "tests", "solution")
HOST_READONLY = ("usr", "etc", "bin", "lib", "lib64", "sbin", "proc", "dev", "sys")
KEEPER_START_TIMEOUT = 10.0
KEPT_STATE = "kept.json"  # in a kept sandbox's host directory: what attach() needs to enter it
# The whole environment of bwrap and nsenter: nothing of this process's environment follows them into
# the sandbox (an LD_PRELOAD of a host library, as vLLM's import sets, breaks the loader in there).
SANDBOX_UID_BASE = 2_000_000_000
SANDBOX_UID_COUNT = 65536
# Docker's default capability set: what root in a container may do, without mounts, tracing,
# module loading or raw devices. Commands entered into the sandbox keep only these.
COMMAND_CAPABILITIES = tuple(
    "chown dac_override fowner fsetid kill setgid setuid setpcap net_bind_service net_raw sys_chroot mknod"
    " audit_write setfcap".split()
)
SHM_BYTES = 64 << 20
# Joins the cgroups named before "--" (each a cgroup.procs file), then runs the rest: a process is
# in the sandbox's cgroups before it starts, so nothing it forks escapes them.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'


def sandbox_root_dir() -> Path:
    """Where sandbox directories live on the host (``TERMGYM_SANDBOX_DIR`` or ``$TMPDIR/termgym``)."""
    return Path(os.environ.get("TERMGYM_SANDBOX_DIR") or Path(tempfile.gettempdir()) / "termgym")


def sandbox_uid() -> int | None:
    """A fresh unprivileged host uid for a sandbox's root when termgym runs as root; None otherwise
    (the sandbox's root is then the user running termgym)."""
    if os.geteuid() != 0:
        return None
    base = int(os.environ.get("TERMGYM_SANDBOX_UID_BASE") or SANDBOX_UID_BASE)
    return base + secrets.randbelow(SANDBOX_UID_COUNT)


def require_tools() -> None:
    """``BackendUnavailable`` (one line, saying what to do) unless bubblewrap, nsenter and setpriv
    are here and a sandbox can be made whose root is an unprivileged user."""
    for name in ("bwrap", "nsenter", "setpriv", "timeout", "env", "sh"):
        host_tool(name)
    if not host_tool("setpriv").startswith("/usr/"):
        raise BackendUnavailable(f"{host_tool('setpriv')} is outside /usr, which is all of the host a sandbox sees")
    _probe_user_namespaces()


@functools.cache
def _require_searchable(root: Path) -> None:
    """The sandbox's unprivileged user opens its directories (bubblewrap binds them as that user):
    every directory down to ``root`` must be searchable by others."""
    for directory in [root, *root.parents]:
        if not directory.stat().st_mode & 0o001:
            raise BackendUnavailable(
                f"{directory} is not searchable by other users, so a sandbox's unprivileged user cannot reach "
                f"{root}; set TERMGYM_SANDBOX_DIR to a directory under /tmp, or chmod o+x {directory}"
            )


@functools.cache
def _bwrap_supports(option: str) -> bool:
    result = subprocess.run([host_tool("bwrap"), "--help"], capture_output=True, text=True, env=HOST_ENV)
    return option in result.stdout


@functools.cache
def _probe_user_namespaces() -> None:
    """Once per process: can an unprivileged sandbox be made here?"""
    uid = sandbox_uid()
    argv = [host_tool("bwrap"), "--unshare-user", "--uid", "0", "--gid", "0", "--ro-bind", "/", "/", "--", "/bin/true"]
    if uid is not None:
        argv = [host_tool("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, env=HOST_ENV)
    if result.returncode != 0:
        why = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackendUnavailable(
            f"the embedded backend runs each sandbox as an unprivileged user, which needs unprivileged user namespaces "
            f"({why}); enable them (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0) or use --backend docker"
        )


def writable_roots(plan: EnvironmentPlan | None) -> list[str]:
    """Top-level directories that get a private writable host directory: the fixed set plus every
    top-level path the Dockerfile works in or copies to (``/workspace``, ``/srv``...)."""
    roots: list[str] = list(BASE_WRITABLE)
    paths: list[str] = []
    if plan is not None:
        paths.append(plan.workdir)
        for step in plan.steps:
            if isinstance(step, CopyStep):
                paths.append(step.dest or step.workdir)
            elif isinstance(step, WorkdirStep):
                paths.append(step.path)
            else:
                paths.append(step.workdir)
    for path in paths:
        top = path.strip("/").split("/", 1)[0]
        if top and top not in roots and top not in HOST_READONLY:
            roots.append(top)
    return roots


@functools.cache
def host_link_exits() -> tuple[str, ...]:
    """Where the host's links in the system directories a verifier's programs are found in lead out
    of the system directories (``termgym.sandboxes.changes.link_exits``), once per process: in a
    sandbox such a path is a writable root's, so a trusted name there runs what the agent wrote."""
    links: dict[str, str] = {}
    for directory in LINKED_DIRECTORIES:
        if os.path.islink(directory) or not os.path.isdir(directory):
            continue  # /bin -> usr/bin: its links are /usr/bin's
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    if entry.is_symlink():
                        links[entry.path] = os.readlink(entry.path)
    return link_exits(links)


class LocalSandbox(Sandbox):
    backend = "local"

    def __init__(self, spec: SandboxSpec) -> None:
        super().__init__(spec)
        self._dir: Path | None = None
        self._roots: list[str] = list(BASE_WRITABLE)
        self._keeper: asyncio.subprocess.Process | None = None
        self._keeper_pid: int | None = None  # host pid of the namespace's first process
        self._channels: list[HostChannel] = []
        self._uid: int | None = None  # the sandbox's root on the host; None: this process's user
        self._cgroup: SandboxCgroup | None = None
        self._storage: SizedFilesystem | None = None
        self._file_size_limit: int | None = None  # bytes a file, where no sized file system is mounted
        self._detached: tuple[int, int | None] | None = None  # a kept keeper's bwrap: (pid, start time)
        self._kept = False  # keep() ran: stop() leaves the sandbox alone
        self._view: Path | None = None  # the overlay over a prepared environment, when started from one
        self._idle = False  # kill_agent_processes ended every process; the next command restarts the keeper
        self._quiet = False  # kill_agent_processes ended every command, and none started since
        self._spare: asyncio.Future[tuple[asyncio.subprocess.Process, int]] | None = None
        self._baseline: dict[str, tuple[int, ...]] = {}  # the watched paths as the agent found them

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        await self._start()
        watched = self._watched_here()
        if watched:  # what the tamper check compares against: the tree before the agent's first command
            self._baseline = await asyncio.to_thread(HostFiles(self.files_dir, self.owner).manifest, watched)

    def _watched_here(self) -> list[str]:
        """What the tamper check watches that this sandbox can change: the spec's watched paths
        and where the host's links in its system directories lead out of them
        (``host_link_exits``), those under the sandbox's writable roots (the rest is the host's,
        read-only)."""
        watched = dict.fromkeys([*self.spec.watched, *host_link_exits()])
        return [path for path in watched if path.strip("/").split("/", 1)[0] in self._roots]

    async def _start(self) -> None:
        require_tools()
        self.image = {"source": "host"}  # the embedded backend runs the host's system, no image
        plan = self._plan()
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

    async def _publish(self, cache: EnvCache, key: str) -> None:
        """Keep this freshly prepared sandbox's roots as the entry ``key``; a warning if it cannot."""
        assert self._dir is not None
        try:
            await cache.publish(
                key, self._dir / "fs", owner=self.owner, roots=self._roots, env=self.env, workdir=self.workdir
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
        await self._make_sandbox_dir()
        await self._make_file_system([*self._roots, "var/tmp"])
        await self._start_processes()
        if plan is not None:
            await prepare_environment(self, plan, self.spec)

    async def _start_from(self, entry: Entry) -> None:
        """Start a sandbox whose writable roots begin as the prepared ``entry``: an overlay over
        it (what the trial writes lands on its own storage; the entry never changes), or a copy
        where no overlay can be mounted (not root)."""
        self._uid = entry.owner if os.geteuid() == 0 else None
        await self._make_sandbox_dir()
        assert self._dir is not None
        fs = self._dir / "fs"
        overlaid = False
        if os.geteuid() == 0:
            await self._make_file_system(["upper", "work"])
            view = self._dir / "root"
            view.mkdir()
            try:
                mount_overlay(entry.tree, fs / "upper", fs / "work", view)
                self._view, overlaid = view, True
            except OSError as exc:  # a path an overlay cannot name, a file system it cannot stack on
                self.warnings.append(f"started from a copy of the prepared environment (no overlay: {exc})")
                for made in (view, fs / "upper", fs / "work"):
                    made.rmdir()
        else:
            await self._make_file_system([])
        if not overlaid and not await copy_tree(entry.tree, fs):
            raise SandboxError(f"could not copy the prepared environment {entry.path}")
        self.env = {**self.env, **entry.env}
        self.workdir = entry.workdir
        self.image = {**self.image, "prepared": entry.key[:16]}
        await self._start_processes()

    async def _make_sandbox_dir(self) -> None:
        root = sandbox_root_dir()
        root.mkdir(parents=True, exist_ok=True)
        if self._uid is not None:
            _require_searchable(root.resolve())
        self._dir = Path(tempfile.mkdtemp(prefix=f"tg-{_slug(self.spec.name)}-", dir=root))
        self._dir.chmod(0o711)  # the sandbox's user must reach its directories; nobody may list them
        labels = {"termgym": "1", **dict(self.spec.labels), "termgym.task": self.spec.name}
        (self._dir / "labels.json").write_text(json.dumps(labels))

    async def _start_processes(self) -> None:
        """The sandbox's cgroups and its keeper; the environment the task asks for."""
        assert self._dir is not None
        self._cgroup, warnings = SandboxCgroup.create(f"termgym-{self._dir.name}", self.spec.resources)
        self.warnings += warnings
        if self.spec.network:
            self.warnings.append("the task asks for network; the embedded backend has none (use --backend docker)")
        await self._start_keeper()
        self._start_spare()
        self.env = {**self.env, **dict(self.spec.env)}

    async def _make_file_system(self, directories: list[str]) -> None:
        """The sandbox's storage, on a file system of the task's storage size where this host
        allows it, owned by the sandbox's user, holding ``directories``."""
        assert self._dir is not None
        fs = self._dir / "fs"
        fs.mkdir()
        size_mb = self.spec.resources.storage_mb
        try:
            self._storage = await uninterrupted(
                SizedFilesystem.create(
                    self._dir / "fs.img", fs, size_mb, self.owner, memory_mb=self.spec.resources.memory_mb
                ),
                lambda made: made.remove(),
            )
        except OSError as exc:
            self._file_size_limit = size_mb << 20
            self.warnings.append(f"storage limit enforced per file only ({size_mb} MB a file): {exc}")
        for path in (fs / name for name in directories):
            path.mkdir(parents=True, exist_ok=True)
            os.chown(path, self.owner, self.owner)

    @property
    def owner(self) -> int:
        """The host uid (and gid) that is root inside the sandbox."""
        return self._uid if self._uid is not None else os.getuid()

    async def stop(self) -> None:
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        if self._kept:
            return
        await self._discard_spare()
        await self._stop_keeper()
        if self._cgroup is not None:
            await self._wait_cgroup_empty()
            await asyncio.to_thread(self._cgroup.remove)
            self._cgroup = None
        if self._view is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(unmount, self._view)
            self._view = None
        if self._storage is not None:
            await self._storage.remove()
            self._storage = None
        if self._dir is not None:
            if is_mounted(self._dir / "fs"):  # a mount made while a cancellation interrupted start()
                await asyncio.to_thread(unmount_sync, self._dir / "fs")
            await asyncio.to_thread(remove_path, self._dir)
            self._dir = None

    async def kill_agent_processes(self) -> None:
        """End every process: the keeper, so the kernel ends its whole PID namespace. The spare
        keeper (started with the sandbox) takes over at once, else the next command starts a new
        one. Until the next command ``host_files`` reaches the files from the host."""
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        spare = await self._take_spare() if not self._idle else None
        await self._stop_keeper()
        cgroup = self._cgroup
        if cgroup is not None:
            spared = set() if spare is None else {spare[0].pid, *_descendants(spare[0].pid)}
            if not await self._wait_until(lambda: cgroup.pids() <= spared):
                await self._discard_spare()
                raise SandboxError("the sandbox's processes did not all end after its keeper was killed")
        if spare is not None:
            self._keeper, self._keeper_pid = spare
            self._spare = None  # handed over: from here on the keeper
            if self._dir is not None:
                (self._dir / "keeper.pid").write_text(str(spare[0].pid))
        else:
            self._idle = True
        self._quiet = True

    async def _ensure_running(self) -> None:
        """Start the keeper again after ``kill_agent_processes``."""
        if self._idle:
            await self._start_keeper()

    def host_files(self) -> HostFiles | None:
        """The sandbox's writable roots from the host while none of the agent's processes runs
        (a keeper the agent never reached, ``sleep`` from the read-only ``/usr``, touches no file)."""
        return HostFiles(self.files_dir, self.owner) if self._quiet and self._dir is not None else None

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
        if self._idle:
            return  # its processes were ended by kill_agent_processes, not by the agent
        if self._keeper_pid is None or not alive(self._keeper_pid):
            raise SandboxBroken("every process of the sandbox was killed from inside (its keeper is gone)")

    async def changed_system_paths(self) -> list[str]:
        """What changed under the spec's watched paths (``SandboxSpec.watched``: the writable
        directories a task's ``[verifier].env`` trusts) since the sandbox started, by the change
        times the host's files carry; nothing else can change: the system directories are the
        host's, bound read-only, and the root directory is read-only too. ``SandboxBroken`` when
        the watched trees grew past what can be compared."""
        watched = self._watched_here()
        if not watched or self._dir is None:
            return []
        try:
            now = await asyncio.to_thread(HostFiles(self.files_dir, self.owner).manifest, watched)
        except OSError as exc:
            raise SandboxBroken(
                f"could not list what changed under {', '.join(watched)}: {exc.strerror or exc}"
            ) from exc
        before = self._baseline
        return sorted(path for path in before.keys() | now.keys() if before.get(path) != now.get(path))

    async def download_tar(self, paths: Sequence[str], *, limit: int, timeout: float = 120.0) -> bytes:
        """From the host while no process runs in the sandbox (``HostFiles.archive``: bounded in
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
        """Never any network here: asking for it is the same warning as at start."""
        return "the task asks for network; the embedded backend has none (use --backend docker)" if enabled else None

    def _plan(self) -> EnvironmentPlan | None:
        if self.spec.dockerfile is None:
            if self.spec.image:
                self.warnings.append(f"image {self.spec.image} is not used by the embedded backend")
            return None
        try:
            return parse_dockerfile(self.spec.dockerfile.read_text(encoding="utf-8", errors="replace"))
        except DockerfileError as exc:
            raise EnvironmentBuildError(f"{self.spec.dockerfile}: {exc}") from exc

    # -- the keeper: the process whose namespaces every command enters --------------------------

    def _bwrap_argv(self, *, detached: bool = False) -> list[str]:
        """The keeper's command line; ``detached`` (a kept sandbox): without ``--die-with-parent``."""
        assert self._dir is not None
        userns = ("--disable-userns",) if _bwrap_supports("--disable-userns") else ()
        options = [
            ("--unshare-all", "--unshare-user", *userns),
            ("--uid", "0", "--gid", "0", "--hostname", "termgym"),
            ("--new-session",) if detached else ("--die-with-parent", "--new-session"),
            ("--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"),
            ("--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib"),
            ("--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin"),
            ("--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"),
        ]
        argv = [host_tool("bwrap"), *(arg for group in options for arg in group)]
        if _bwrap_supports("--size"):
            argv += ["--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"]
        for name in self._roots:
            argv += ["--bind", str(self.files_dir / name), f"/{name}"]
        # The keeper says "ready" once the sandbox is fully set up; commands enter its namespaces.
        argv += ["--remount-ro", "/", "--chdir", "/", "--clearenv"]
        argv += ["--", "/bin/sh", "-c", "echo ready; exec /bin/sleep infinity"]
        if self._uid is not None:
            argv = [host_tool("setpriv"), f"--reuid={self._uid}", f"--regid={self._uid}", "--clear-groups", "--", *argv]
        return self._on_host(argv)

    def _on_host(self, argv: list[str]) -> list[str]:
        """``argv`` run in the sandbox's cgroups and under its file size limit, from its first instruction."""
        if self._file_size_limit is not None:
            argv = [host_tool("prlimit"), f"--fsize={self._file_size_limit}", "--", *argv]
        if self._cgroup is not None:
            argv = [host_tool("sh"), "-c", _JOIN, "sh", *self._cgroup.procs_files, "--", *argv]
        return argv

    async def _start_keeper(self) -> None:
        self._keeper, self._keeper_pid = await self._spawn_keeper()
        self._idle = False
        if self._dir is not None:
            (self._dir / "keeper.pid").write_text(str(self._keeper.pid))

    async def _spawn_keeper(self) -> tuple[asyncio.subprocess.Process, int]:
        """A new keeper, its namespaces set up: (its bwrap on the host, the keeper's host pid)."""
        process = await spawn(
            self._bwrap_argv(),
            end_keeper,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # out of the terminal's process group: Ctrl-C is termgym's to handle
        )
        assert process.stdout is not None and process.stderr is not None
        try:
            line = await wait_for(process.stdout.readline(), KEEPER_START_TIMEOUT)
            if line != b"ready\n":
                raise ValueError("the keeper did not start")
            # bwrap (host) -> the namespace's init -> the keeper command: enter the keeper's.
            (init,) = children(process.pid)
            (keeper,) = children(init)
        except (TimeoutError, ValueError) as exc:
            await end_keeper(process)
            stderr = (await read_stderr(process)).strip() or str(exc)
            raise SandboxError(f"bubblewrap failed to start a sandbox: {stderr}") from exc
        except BaseException:
            await end_keeper(process)
            raise
        return process, keeper

    # -- the spare keeper: a clean namespace ready for the verifier --------------------------------

    def _start_spare(self) -> None:
        """Start a second keeper in the background, which no command ever enters until it takes
        over: ``kill_agent_processes`` then ends the first one's whole namespace and goes on at
        once in a namespace the agent never reached (no keeper to start on the verifier's path)."""
        self._spare = asyncio.ensure_future(self._spawn_keeper())

    async def _take_spare(self) -> tuple[asyncio.subprocess.Process, int] | None:
        """The spare keeper (waited for if it is still starting), alive; None if there is none.
        It stays ``self._spare`` until the caller hands it over, so that a cancellation before
        then leaves it to ``stop`` (``_discard_spare``) rather than running unowned."""
        spare = self._spare
        if spare is None:
            return None
        try:
            process, keeper = await asyncio.shield(spare)
        except (SandboxError, OSError):
            self._spare = None
            return None
        if not alive(keeper):
            await self._discard_spare()
            return None
        return process, keeper

    async def _discard_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is None:
            return
        if not spare.done():
            spare.cancel()
        try:
            process, _ = await spare
        except (asyncio.CancelledError, SandboxError, OSError):
            return
        await end_keeper(process)

    async def _stop_keeper(self) -> None:
        if self._keeper is not None:
            await end_keeper(self._keeper)
        elif self._detached is not None:
            await asyncio.to_thread(end_detached, *self._detached)
            if self._dir is not None:
                (self._dir / KEPT_STATE).unlink(missing_ok=True)  # no longer kept: owned by this process
        self._keeper_pid = None
        self._keeper = None
        self._detached = None

    # -- keeping it past this process, and entering it again -------------------------------------

    async def keep(self) -> dict[str, str]:
        """Restart the keeper detached from this process (the agent's processes end; the files
        stay) and write ``kept.json``; after it ``stop`` leaves the sandbox alone."""
        if self._dir is None:
            raise SandboxError("the sandbox is not running")
        for channel in self._channels:
            await channel.close()
        self._channels.clear()
        await self._discard_spare()
        await self._stop_keeper()
        if self._cgroup is not None and not await self._wait_cgroup_empty():
            raise SandboxError("the sandbox's processes did not all end before its keeper was detached")
        argv, log = self._bwrap_argv(detached=True), self._dir / "keeper.log"
        pid = await asyncio.to_thread(start_detached, argv, log=log, timeout=KEEPER_START_TIMEOUT)
        self._detached = (pid, start_time(pid))
        try:
            (init,) = children(pid)
            (keeper,) = children(init)
        except ValueError as exc:
            await self._stop_keeper()
            raise SandboxError("the kept sandbox's keeper did not start its namespace") from exc
        self._keeper_pid = keeper
        self._idle = False
        (self._dir / "keeper.pid").write_text(str(pid))
        _write_json(self._dir / KEPT_STATE, self._kept_state())
        self._kept = True
        name = self._dir.name
        return {
            "backend": "local",
            "id": name,
            "attach": f"termgym shell --attach {name} --backend local",
            "remove": f"termgym gc --backend local {name}",
        }

    def _kept_state(self) -> dict:
        """What ``attach`` needs to enter this sandbox from another process (JSON)."""
        assert self._detached is not None
        storage = self._storage
        return {
            "bwrap": list(self._detached),
            "keeper": self._keeper_pid,
            "keeper_start": start_time(self._keeper_pid) if self._keeper_pid else None,
            "uid": self._uid,
            "roots": self._roots,
            "cgroup": {c: [v, str(d)] for c, (v, d) in self._cgroup.dirs.items()} if self._cgroup else None,
            "storage": None
            if storage is None
            else {"image": storage.image and str(storage.image), "size_mb": storage.size_mb},
            "file_size_limit": self._file_size_limit,
            "view": self._view and str(self._view),
            "env": self.env,
            "workdir": self.workdir,
            "image": self.image,
            "name": self.spec.name,
            "resources": vars(self.spec.resources),
            "labels": dict(self.spec.labels),
        }

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
        sandbox._detached = (int(state["bwrap"][0]), state["bwrap"][1])
        sandbox._keeper_pid = int(state["keeper"])
        if state.get("cgroup"):
            dirs = {c: (int(v), Path(d)) for c, (v, d) in state["cgroup"].items()}
            sandbox._cgroup = SandboxCgroup(dirs, spec.resources)
        if state.get("storage"):
            image = state["storage"]["image"]
            sandbox._storage = SizedFilesystem(image and Path(image), directory / "fs", state["storage"]["size_mb"])
        sandbox._file_size_limit = state.get("file_size_limit")
        sandbox._view = Path(state["view"]) if state.get("view") else None
        sandbox.env = dict(state["env"])
        sandbox.workdir = state["workdir"]
        sandbox.image = dict(state.get("image") or {})
        return sandbox

    def _enter_argv(self, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> list[str]:
        """``argv`` run in the sandbox as its root, with ``COMMAND_CAPABILITIES`` only, exactly ``env``."""
        if self._keeper_pid is None:
            raise SandboxError("the sandbox is not running")
        if not alive(self._keeper_pid):
            raise SandboxBroken("every process of the sandbox was killed from inside (its keeper is gone)")
        pairs = [f"{key}={value}" for key, value in env.items()]
        capabilities = ",".join(f"+{name}" for name in COMMAND_CAPABILITIES)
        namespaces = ["-U", "-m", "-p", "-n", "-i", "-u", "-r", "-w"]  # all the keeper's, its root and cwd too
        enter = [host_tool("nsenter"), "-t", str(self._keeper_pid), *namespaces, "--"]
        drop = [host_tool("setpriv"), "--inh-caps=-all", f"--bounding-set=-all,{capabilities}", "--"]
        return self._on_host([*enter, *drop, "/usr/bin/env", "-i", "-C", cwd, *pairs, *argv])

    # -- commands ----------------------------------------------------------------------------------

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
        # `timeout` inside the sandbox kills the command's whole process group (TERM, then KILL
        # one second later); the host-side deadline is only a backstop if that fails.
        await self._ensure_running()
        self._quiet = False
        limit = max(timeout, 0.001)
        inner = ["/usr/bin/timeout", "-k", "1", f"{limit:.3f}", *argv]
        command = self._enter_argv(inner, self.env if env is None else env, cwd or self.workdir)
        process = await spawn(
            command,
            end_entered,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        capture = OutputCapture(output_limit)
        started = time.monotonic()
        try:
            await wait_for(communicate(process, stdin, capture), limit + 5.0)
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
        )

    async def open_process(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str) -> ProcessChannel:
        await self._ensure_running()
        self._quiet = False
        process = await spawn(
            self._enter_argv(argv, env, cwd),
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
        """The host directory whose subdirectories are the sandbox's writable roots (``app``...)."""
        if self._dir is None:
            raise SandboxError("the sandbox is not running")
        return self._view or self._dir / "fs"


def _descendants(pid: int) -> list[int]:
    found, queue = [], [pid]
    while queue:
        for child in children(queue.pop()):
            found.append(child)
            queue.append(child)
    return found


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)[-40:].strip("-") or uuid.uuid4().hex[:8]


def _write_json(path: Path, data: dict) -> None:
    """Write ``path`` whole or not at all (a reader never sees half of it)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def read_kept(directory: Path) -> dict | None:
    """The state of the kept sandbox in ``directory`` while its keeper runs (the same processes
    that were kept, not reused pids); None when there is none, or it is no longer running."""
    try:
        state = json.loads((directory / KEPT_STATE).read_text())
        pid, started = int(state["bwrap"][0]), state["bwrap"][1]
        keeper, keeper_started = int(state["keeper"]), state.get("keeper_start")
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if not (same_process(pid, started) and same_process(keeper, keeper_started)):
        return None
    return state


def _end_kept(path: Path) -> bool:
    """End the keeper of the kept sandbox in ``path`` (if it still runs) and wait until its cgroups
    are empty, then remove them; True when it was a kept sandbox. Blocking."""
    try:
        state = json.loads((path / KEPT_STATE).read_text())
        pid, started = int(state["bwrap"][0]), state["bwrap"][1]
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False
    end_detached(pid, started)
    if state.get("cgroup"):
        SandboxCgroup({c: (int(v), Path(d)) for c, (v, d) in state["cgroup"].items()}, Resources()).end_all()
    return True


def collect_garbage(root: Path | None = None) -> int:
    """Remove sandbox directories whose keeper is gone (left by a run that was killed) and kept
    sandboxes (``--keep``: their keeper is ended), with their file systems and cgroups; a sandbox
    whose keeper still runs and that is not kept belongs to a live run and stays. Returns how many
    were removed."""
    return len(collect_sandboxes(root))


def collect_sandboxes(root: Path | None = None) -> list[tuple[str, bool]]:
    """``collect_garbage``, saying what went: (directory name, whether it was a kept sandbox)."""
    removed: list[tuple[str, bool]] = []
    live: set[str] = set()
    for path in sorted((root or sandbox_root_dir()).glob("tg-*")):
        if not (path / "labels.json").exists():
            continue
        if _end_kept(path):
            unmount_sync(path / "root")
            unmount_sync(path / "fs")
            remove_path(path)
            removed.append((path.name, True))
            continue
        try:
            pid = int((path / "keeper.pid").read_text())
            running = alive(pid) and Path(f"/proc/{pid}/comm").read_text().strip() == "bwrap"
        except (OSError, ValueError):
            running = False
        if running:
            live.add(f"termgym-{path.name}")
            continue
        if cgroup := SandboxCgroup.find(f"termgym-{path.name}"):
            cgroup.end_all()  # a keeper that outlived its killed run (seen: the spare) may hold the mounts below
        unmount_sync(path / "root")  # an overlay over a prepared environment, on the storage below
        unmount_sync(path / "fs")
        remove_path(path)
        removed.append((path.name, False))
    remove_stale("termgym-tg-", keep=live)
    return removed


# -- the backend registry's hooks (termgym.sandboxes) ----------------------------------------------


def preflight() -> None:
    """``BackendUnavailable`` unless this machine can make embedded sandboxes (``require_tools``)."""
    require_tools()


async def remove_leftovers(images: bool = False) -> str:
    """``termgym gc``: remove what killed runs left and every kept sandbox (``collect_sandboxes``);
    one line saying how much, naming the kept ones; then the prepared environments no sandbox
    uses (``EnvCache.clear``)."""
    removed = await asyncio.to_thread(collect_sandboxes)
    kept = [name for name, was_kept in removed if was_kept]
    named = f" ({len(kept)} kept: {', '.join(kept)})" if kept else ""
    cleared, in_use = await asyncio.to_thread(EnvCache.from_environment().clear)
    busy = f", {in_use} in use kept" if in_use else ""
    return f"removed {len(removed)} leftover local sandbox(es){named} and {cleared} prepared environment(s){busy}"


async def attach(sandbox_id: str) -> LocalSandbox:
    """The kept sandbox ``sandbox_id`` (a directory under ``sandbox_root_dir()``), started: its
    commands enter the kept keeper's namespaces; ``stop`` removes it. ``ConfigError`` in one line
    when there is no such kept sandbox running."""
    missing = ConfigError(f"no kept sandbox {sandbox_id} (termgym gc removed it, or it was never kept)")
    if not sandbox_id.startswith("tg-") or "/" in sandbox_id or sandbox_id in (".", ".."):
        raise missing
    directory = sandbox_root_dir() / sandbox_id
    state = await asyncio.to_thread(read_kept, directory)
    if state is None:
        raise missing
    try:
        return LocalSandbox.from_kept(directory, state)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"kept sandbox {sandbox_id}: its {KEPT_STATE} is unreadable ({exc})") from exc


async def close_shared() -> None:
    """Nothing is shared between this backend's sandboxes."""
