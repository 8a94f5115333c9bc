"""A sandbox's own mount namespace, where its storage and its overlay are mounted (as root) instead
of in this process's namespace, so that the host's mount table does not grow with the sandboxes
alive. Every keeper of the sandbox is started inside it.

Guarantees: what ``run`` mounts is in the sandbox's namespace only, copied into no namespace made
later; ``reach`` names a path of the sandbox's directory as the host reaches it in the namespace
(never the empty directory under the mounts); the kernel unmounts everything once neither this
object nor a process holds the namespace, so a killed run leaves no mount; ``hold`` keeps the
prepared environment an overlay in it stands on from eviction while the namespace is open. Each
operation inside runs in a thread of its own that enters the namespace, never the event loop's
thread or a pooled one. Without root there is no such namespace (``holder``).

Why and how: docs/guides/backends.md#inside-one-embedded-sandbox."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
import functools
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

CLONE_FS = 0x200
CLONE_NEWNS = 0x20000
MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x2, 0x4, 0x8
MS_REC = 0x4000
MS_SLAVE = 0x80000
T = TypeVar("T")


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{what}: {os.strerror(code)}")


def _in_thread(operation: Callable[[], T]) -> T:
    """``operation()`` in a new thread (which it may move into another namespace), its result or
    its exception. Blocking."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(operation())
        except BaseException as exc:  # handed to the caller
            failure.append(exc)

    thread = threading.Thread(target=run, name="termgym-mount-namespace", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return outcome[0]


class MountNamespace:
    """The mount namespace of the sandbox whose directory is ``home`` (see the module's guarantees)."""

    def __init__(self, home: Path, namespace_fd: int, home_fd: int) -> None:
        self.home = home
        self._namespace_fd: int | None = namespace_fd
        self._home_fd = home_fd
        self._held: list[int] = []  # lock files held shared (``hold``)

    @classmethod
    def create(cls, home: Path) -> MountNamespace:
        """A new namespace for the sandbox at ``home`` (an existing directory); ``OSError`` where
        this process cannot make one (not root). Blocking."""

        def make() -> tuple[int, int]:
            _check(_libc().unshare(CLONE_NEWNS), "making a mount namespace")
            _check(_libc().mount(None, b"/", None, MS_REC | MS_SLAVE, None), "making its mounts slaves")
            # A /proc of its own: what bubblewrap and the guard look up in /proc/sys/user from each
            # new user namespace adds a dentry there per namespace, and every such lookup through
            # one shared /proc walks all of them (a start's cost grew with the sandboxes alive).
            flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
            _check(_libc().mount(b"proc", b"/proc", b"proc", flags, None), "mounting its own /proc")
            return _open_here(home)

        namespace_fd, home_fd = _in_thread(make)
        return cls(home, namespace_fd, home_fd)

    @classmethod
    def join(cls, home: Path, pid: int) -> MountNamespace | None:
        """The namespace of the sandbox at ``home`` that the process ``pid`` (its kept keeper's
        bubblewrap) is in; None when that is this process's own (a sandbox from before namespaces
        of their own, whose mounts are the host's). ``OSError`` when ``pid`` is gone. Blocking."""
        path = f"/proc/{pid}/ns/mnt"
        if os.stat(path).st_ino == os.stat("/proc/self/ns/mnt").st_ino:
            return None
        namespace_fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

        def open_home() -> int:
            _enter(namespace_fd)
            return _open_home(home)

        try:
            home_fd = _in_thread(open_home)
        except BaseException:
            os.close(namespace_fd)
            raise
        return cls(home, namespace_fd, home_fd)

    @property
    def path(self) -> str:
        """The namespace as a file a root process may open (``nsenter --mount=``)."""
        if self._namespace_fd is None:
            raise OSError(f"the mount namespace of {self.home} is closed")
        return f"/proc/{os.getpid()}/fd/{self._namespace_fd}"

    def run(self, operation: Callable[..., T], *args: object) -> T:
        """``operation(*args)`` inside the namespace (paths as the sandbox's mounts see them). Blocking."""
        if self._namespace_fd is None:
            raise OSError(f"the mount namespace of {self.home} is closed")
        namespace_fd = self._namespace_fd

        def inside() -> T:
            _enter(namespace_fd)
            return operation(*args)

        return _in_thread(inside)

    def reach(self, path: Path) -> Path:
        """``path`` (``home`` or below it) as this process reaches it in the namespace."""
        return Path(f"/proc/{os.getpid()}/fd/{self._home_fd}") / path.relative_to(self.home)

    def mountinfo(self) -> str:
        """The namespace's mount table (``/proc/PID/mountinfo``'s format). Blocking."""
        return self.run(lambda: Path("/proc/thread-self/mountinfo").read_text())

    def hold(self, lock: Path) -> None:
        """Hold a shared lock on the file ``lock`` until the namespace is closed (``flock``)."""
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BaseException:
            os.close(fd)
            raise
        self._held.append(fd)

    @property
    def closed(self) -> bool:
        return self._namespace_fd is None

    def close(self) -> None:
        """Let the namespace go (it ends once no process is in it); idempotent."""
        if self._namespace_fd is None:
            return
        for fd in (self._namespace_fd, self._home_fd, *self._held):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._namespace_fd, self._held = None, []


def sandbox_namespace(home: Path) -> MountNamespace | None:
    """A namespace of its own for the sandbox at ``home`` where this process may make one (root);
    None otherwise: then it makes no mount (not root), or makes them in this process's namespace
    as before. Blocking (a thread, about a millisecond)."""
    if os.geteuid() != 0:
        return None
    try:
        return MountNamespace.create(home)
    except OSError:
        return None


def in_namespace(namespace: MountNamespace | None, operation: Callable[..., T], *args: object) -> T:
    """``operation(*args)`` inside ``namespace``, or here when there is none. Blocking."""
    return namespace.run(operation, *args) if namespace is not None else operation(*args)


def reach(namespace: MountNamespace | None, path: Path) -> Path:
    """``path`` as this process reaches it: through ``namespace`` when there is one."""
    return namespace.reach(path) if namespace is not None else path


def namespace_mountinfos() -> list[str]:
    """The mount table of every mount namespace some process is in (this process's first, then one
    process's of each other: sandboxes', keepers'), read through ``/proc``. Blocking."""
    seen: set[tuple[int, int]] = set()
    tables: list[str] = []
    for entry in ["self", *(name for name in os.listdir("/proc") if name.isdigit())]:
        try:
            stat = os.stat(f"/proc/{entry}/ns/mnt")
            if (stat.st_dev, stat.st_ino) in seen:
                continue
            seen.add((stat.st_dev, stat.st_ino))
            tables.append(Path(f"/proc/{entry}/mountinfo").read_text())
        except OSError:
            continue  # gone meanwhile, or not ours to read
    return tables


def _enter(namespace_fd: int) -> None:
    """Move the calling thread (alone) into the mount namespace ``namespace_fd``."""
    _check(_libc().unshare(CLONE_FS), "unsharing this thread's file-system attributes")
    _check(_libc().setns(namespace_fd, CLONE_NEWNS), "entering the sandbox's mount namespace")


def _open_here(home: Path) -> tuple[int, int]:
    """This thread's mount namespace and ``home`` in it, as descriptors."""
    namespace_fd = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return namespace_fd, _open_home(home)
    except BaseException:
        os.close(namespace_fd)
        raise


def _open_home(home: Path) -> int:
    return os.open(home, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
