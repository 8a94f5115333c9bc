"""Memory, process and CPU limits for the embedded backend, through cgroups (v2, or v1 as on hosts
that still mount the controllers one by one).

Guarantees, where ``SandboxCgroup.create`` returns a cgroup: every process that joins it (the
sandbox's keeper and every command entered into the sandbox join before they start) and everything
they fork is held to the task's memory (swap included, where the kernel accounts it), to
``PIDS_LIMIT`` processes and to its CPUs' worth of time per period; ``limit_warnings`` says which
limit the sandbox reached (an OOM kill, a refused fork). Where a controller is missing or its
hierarchy is not writable (not root, a v2 cgroup that holds processes and so cannot delegate), that
limit is not enforced and ``create`` returns one warning line per missing limit instead: never a
silent gap.

Where a sandbox's cgroup goes: under this process's own cgroup (so a limit on termgym also bounds
its sandboxes), else, for root, under a ``termgym`` cgroup at the top of the hierarchy. The pure
parts (what to write where, reading the kernel's files) take a file-system root for their tests.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

from termgym.sandboxes.base import Resources
from termgym.sandboxes.host_processes import POLL_SEC

PIDS_LIMIT = 512
CPU_PERIOD_US = 100_000
CONTROLLERS = ("memory", "pids", "cpu")
WHAT = {"memory": "memory", "pids": "process-count", "cpu": "CPU"}


@dataclass(frozen=True)
class Hierarchy:
    """Where one or more controllers are mounted, and this process's cgroup in that hierarchy."""

    version: int  # 1 or 2
    mount: Path
    own: str  # this process's cgroup, relative to the mount ("/" for the root)
    controllers: tuple[str, ...]


def parse_mountinfo(text: str) -> list[tuple[str, str, set[str]]]:
    """``(mount point, file-system type, super options)`` of each cgroup and cgroup2 mount."""
    mounts = []
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(rest) < 3 or rest[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append((fields[4].replace("\\040", " "), rest[0], set(rest[2].split(","))))
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller (``"0"`` for the v2 hierarchy) to this process's cgroup path, from ``/proc/self/cgroup``."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and controllers == "":
            paths["0"] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def find_hierarchies(mountinfo: str, proc_cgroup: str, root: Path = Path("/")) -> dict[str, Hierarchy]:
    """For each controller of ``CONTROLLERS`` that this host has: the hierarchy that holds it (a v1
    mount of its own, else the v2 hierarchy where its ``cgroup.controllers`` lists it)."""
    own = parse_proc_cgroup(proc_cgroup)
    found: dict[str, Hierarchy] = {}
    for point, fstype, options in parse_mountinfo(mountinfo):
        mount = root / point.lstrip("/")
        if fstype == "cgroup":
            for controller in CONTROLLERS:
                if controller in options and controller in own and controller not in found:
                    found[controller] = Hierarchy(1, mount, own[controller], (controller,))
        else:
            try:
                available = (mount / "cgroup.controllers").read_text().split()
            except OSError:
                continue
            usable = tuple(c for c in CONTROLLERS if c in available and c not in found)
            hierarchy = Hierarchy(2, mount, own.get("0", "/"), usable)
            for controller in usable:
                found[controller] = hierarchy
    return found


def limit_files(version: int, controller: str, resources: Resources) -> list[tuple[str, str]]:
    """The files (relative to the sandbox's cgroup) and values that set one controller's limit,
    in the order they must be written."""
    memory = str(resources.memory_mb << 20)
    quota = str(max(1000, round(resources.cpus * CPU_PERIOD_US)))
    if version == 1:
        return {
            "memory": [("memory.limit_in_bytes", memory), ("memory.memsw.limit_in_bytes", memory)],
            "pids": [("pids.max", str(PIDS_LIMIT))],
            "cpu": [("cpu.cfs_period_us", str(CPU_PERIOD_US)), ("cpu.cfs_quota_us", quota)],
        }[controller]
    return {
        "memory": [("memory.max", memory), ("memory.swap.max", "0")],
        "pids": [("pids.max", str(PIDS_LIMIT))],
        "cpu": [("cpu.max", f"{quota} {CPU_PERIOD_US}")],
    }[controller]


def event_counts(version: int, controller: str, directory: Path) -> int:
    """How often a limit acted: OOM kills (memory), refused forks (pids); 0 when unknown."""
    name = {
        ("memory", 1): "memory.oom_control",
        ("memory", 2): "memory.events",
        ("pids", 1): "pids.events",
        ("pids", 2): "pids.events",
    }.get((controller, version))
    key = "oom_kill" if controller == "memory" else "max"
    if name is None:
        return 0
    try:
        for line in (directory / name).read_text().splitlines():
            field, _, value = line.partition(" ")
            if field == key and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return 0


class SandboxCgroup:
    """One sandbox's cgroup: one directory per hierarchy its controllers live in."""

    def __init__(self, dirs: dict[str, tuple[int, Path]], resources: Resources) -> None:
        self.dirs = dirs  # controller -> (version, directory)
        self.resources = resources

    @classmethod
    def create(
        cls, name: str, resources: Resources, *, root: Path = Path("/")
    ) -> tuple[SandboxCgroup | None, list[str]]:
        """The cgroup ``name`` with the task's limits, and a warning per limit that is not enforced."""
        try:
            mountinfo = (root / "proc/self/mountinfo").read_text()
            proc_cgroup = (root / "proc/self/cgroup").read_text()
        except OSError:
            mountinfo = proc_cgroup = ""
        hierarchies = find_hierarchies(mountinfo, proc_cgroup, root)
        dirs: dict[str, tuple[int, Path]] = {}
        problems: dict[str, str] = {}
        made: dict[Path, Path] = {}  # hierarchy mount -> the directory made in it
        for controller in CONTROLLERS:
            hierarchy = hierarchies.get(controller)
            if hierarchy is None:
                problems[controller] = "the host has no such cgroup controller"
                continue
            try:
                directory = made.get(hierarchy.mount) or _make_dir(hierarchy, name)
                made[hierarchy.mount] = directory
                for file, value in limit_files(hierarchy.version, controller, resources):
                    _write(directory / file, value, optional=file in ("memory.memsw.limit_in_bytes", "memory.swap.max"))
                dirs[controller] = (hierarchy.version, directory)
            except OSError as exc:
                problems[controller] = f"cgroup {hierarchy.mount} is not writable here ({exc.strerror or exc})"
        warnings = [f"{WHAT[c]} limit not enforced: {why}" for c, why in problems.items()]
        if not dirs:
            for directory in made.values():
                _remove_dir(directory)
            return None, warnings
        return cls(dirs, resources), warnings

    @classmethod
    def find(cls, name: str, *, root: Path = Path("/")) -> SandboxCgroup | None:
        """The cgroup ``name`` as ``create`` made it (where ``_make_dir`` puts it), from its
        directories that exist; None where none does."""
        try:
            hierarchies = _host_hierarchies(root)
        except OSError:
            return None
        dirs: dict[str, tuple[int, Path]] = {}
        for controller, hierarchy in hierarchies.items():
            for parent in _parents(hierarchy):
                if (parent / name).is_dir():
                    dirs[controller] = (hierarchy.version, parent / name)
                    break
        return cls(dirs, Resources()) if dirs else None

    @property
    def procs_files(self) -> list[str]:
        """The ``cgroup.procs`` files that list the cgroup's processes (one per hierarchy)."""
        return sorted({str(directory / "cgroup.procs") for _, directory in self.dirs.values()})

    @property
    def join_files(self) -> list[str]:
        """The files a single-threaded process writes ``0`` (itself) into to join (one per hierarchy):
        on v1 ``tasks``, which moves the writing thread alone and so without the kernel's global
        ``cgroup_threadgroup_rwsem`` (whose writer waits for an RCU grace period unless another move
        came just before: 2 to 17 ms on the development machine, against 0.04 ms); on v2, where a
        domain cgroup has no per-thread file, ``cgroup.procs``."""
        files = {
            str(directory / ("tasks" if version == 1 else "cgroup.procs")) for version, directory in self.dirs.values()
        }
        return sorted(files)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.procs_files:
            with contextlib.suppress(OSError):
                found |= {int(p) for p in Path(path).read_text().split()}
        return found

    def limit_warnings(self) -> list[str]:
        warnings = []
        if "memory" in self.dirs:
            version, directory = self.dirs["memory"]
            if kills := event_counts(version, "memory", directory):
                warnings.append(
                    f"the sandbox reached its memory limit ({self.resources.memory_mb} MB): {kills} process(es) killed"
                )
        if "pids" in self.dirs:
            version, directory = self.dirs["pids"]
            if refused := event_counts(version, "pids", directory):
                warnings.append(f"the sandbox reached its process limit ({PIDS_LIMIT}): {refused} fork(s) refused")
        return warnings

    def remove(self) -> None:
        """Remove the cgroup's directories (once its processes are gone)."""
        for directory in {d for _, d in self.dirs.values()}:
            _remove_dir(directory)

    def end_all(self, timeout: float = 5.0) -> None:
        """Kill every process in the cgroup until none is left (``timeout`` at most), then remove
        it. For a sandbox whose owner is gone: a keeper that outlived its killed run is in here
        even where no file names it. Blocking."""
        deadline = time.monotonic() + timeout
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(POLL_SEC)
        self.remove()


def _host_hierarchies(root: Path) -> dict[str, Hierarchy]:
    return find_hierarchies((root / "proc/self/mountinfo").read_text(), (root / "proc/self/cgroup").read_text(), root)


def _parents(hierarchy: Hierarchy) -> tuple[Path, Path]:
    """Where ``_make_dir`` makes a sandbox's directory, in the order it tries."""
    return hierarchy.mount / hierarchy.own.strip("/"), hierarchy.mount / "termgym"


def _make_dir(hierarchy: Hierarchy, name: str) -> Path:
    """The sandbox's directory under this process's cgroup, else (v1, or v2 where the own cgroup
    holds processes and cannot enable controllers for children) under ``termgym`` at the top."""
    own, fallback = _parents(hierarchy)
    last: OSError | None = None
    for parent in (own, fallback):
        try:
            if parent != own:
                parent.mkdir(exist_ok=True)
            if hierarchy.version == 2:
                wanted = " ".join(f"+{c}" for c in hierarchy.controllers)
                if set(hierarchy.controllers) - set((parent / "cgroup.subtree_control").read_text().split()):
                    _write(parent / "cgroup.subtree_control", wanted)
            directory = parent / name
            directory.mkdir()
            return directory
        except OSError as exc:
            last = exc
    assert last is not None
    raise last


def _write(path: Path, value: str, *, optional: bool = False) -> None:
    try:
        with open(path, "w") as handle:
            handle.write(value)
    except FileNotFoundError:
        if not optional:
            raise


def _remove_dir(directory: Path) -> None:
    for _ in range(200):
        try:
            directory.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                return
            time.sleep(0.01)


def remove_stale(
    prefix: str = "termgym-tg-",
    *,
    root: Path = Path("/"),
    keep: frozenset[str] | set[str] = frozenset(),
    held: Callable[[Collection[str]], Collection[str]] | None = None,
) -> int:
    """Remove this host's empty sandbox cgroups named ``prefix...`` (left by killed runs) in the
    places ``_make_dir`` uses, except the names in ``keep`` and those ``held`` gives of the empty
    ones (the caller's check that no live process owns them, run after they were found empty: a
    live sandbox's cgroup is empty before its keeper starts and while it has none); returns how
    many were removed."""
    try:
        hierarchies = _host_hierarchies(root)
    except OSError:
        return 0
    empty: list[Path] = []
    for parent in {parent for h in hierarchies.values() for parent in _parents(h)}:
        for directory in parent.glob(f"{prefix}*") if parent.is_dir() else []:
            if directory.name in keep or not directory.is_dir():
                continue
            with contextlib.suppress(OSError):
                if not (directory / "cgroup.procs").read_text().strip():
                    empty.append(directory)
    owned = set(held({d.name for d in empty})) if held is not None and empty else set()
    removed = 0
    for directory in empty:
        if directory.name not in owned:
            with contextlib.suppress(OSError):
                os.rmdir(directory)  # refused (EBUSY) should a process have joined it meanwhile
                removed += 1
    return removed
