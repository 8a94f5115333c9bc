"""A sandbox's home on the host: its directory (its labels for ``termgym gc``), the storage its
writable roots live on, the overlay over a prepared environment, and their removal.

The storage is a file system of the task's size where this host allows it (``SizedFilesystem``:
a ``tmpfs`` or an ext4 image on a loop device, as root), else a per-file size limit with a warning.
As root, the storage and the overlay are mounted in the sandbox's own mount namespace
(``termgym.sandboxes.local.namespace``), never in the host's; the host reaches them through it.
``remove_home`` undoes everything, whatever stage a cancelled start reached, and never follows a
link or recurses into the agent's trees (``host_trees.remove_path``).

A live sandbox's directory is locked (``flock``, shared) by the process that made it, from before
anything of it exists (its labels, its cgroups) until after its removal, and by a process that
attached it (``hold_home``): ``termgym gc`` removes a directory only while it holds the exclusive
lock (``claim_home``), so never one a live process holds, whatever state its sandbox is in (starting,
idle with no keeper). The kernel releases the lock of a process that dies, so a killed run's
directories are gc's. One descriptor per sandbox, close-on-exec: no keeper or command holds it.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import tempfile
import uuid
from collections.abc import Mapping
from pathlib import Path

from termgym.aio import uninterrupted
from termgym.sandboxes.base import Resources
from termgym.sandboxes.local.env_cache import Entry
from termgym.sandboxes.local.host import require_searchable, sandbox_root_dir
from termgym.sandboxes.local.host_trees import remove_path
from termgym.sandboxes.local.mounts import mount_overlay, unmount
from termgym.sandboxes.local.namespace import MountNamespace, in_namespace, reach
from termgym.sandboxes.local.storage import SizedFilesystem, is_mounted, unmount_sync
from termgym.sandboxes.local.subids import remove_mapped, subordinate_ids


def make_home(name: str, labels: Mapping[str, str], *, private_user: bool) -> Path:
    """A fresh directory for the sandbox of task ``name`` under ``sandbox_root_dir()``, reachable
    by the sandbox's unprivileged user (``private_user``; else by this user alone) but listable by
    nobody, with its labels."""
    root = sandbox_root_dir()
    root.mkdir(parents=True, exist_ok=True)
    if private_user:
        require_searchable(root.resolve())
    home = Path(tempfile.mkdtemp(prefix=f"tg-{_slug(name)}-", dir=root))
    try:  # before its labels: gc passes over a directory without them, so nothing else locks it
        if not hold_home(home):
            raise OSError(f"{home} is locked by another process")
    except OSError:
        home.rmdir()
        raise
    # the sandbox's user must reach its directories; nobody may list them. This user's alone without
    # root: a set-user-id program an agent leaves in its layer is nobody's to run (a USER's is of its range)
    home.chmod(0o711 if private_user else 0o700)
    write_labels(home, name, labels)
    return home


_HELD: dict[str, list[int]] = {}  # a sandbox directory -> this process's descriptors locking it shared


def hold_home(home: Path) -> bool:
    """Lock the sandbox directory ``home`` shared for this process until ``remove_home`` (or this
    process's end); False when ``termgym gc`` holds it (it is being removed). ``OSError`` when it
    cannot be opened."""
    fd = _lock(home, fcntl.LOCK_SH)
    if fd is None:
        return False
    _HELD.setdefault(str(home), []).append(fd)
    return True


def release_home(home: Path) -> None:
    """Let go of this process's locks on ``home`` (``hold_home``)."""
    for fd in _HELD.pop(str(home), []):
        os.close(fd)


def claim_home(home: Path) -> int | None:
    """``home``'s lock held exclusively, for gc to remove it (closing the descriptor returned lets
    go); None when a live process holds it (``hold_home``) or another gc does, or it is gone."""
    try:
        return _lock(home, fcntl.LOCK_EX)
    except OSError:
        return None


def _lock(home: Path, mode: int) -> int | None:
    """A descriptor of the directory ``home`` holding ``flock(mode)``; None when another holds a
    lock that excludes it."""
    fd = os.open(home, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_labels(home: Path, name: str, labels: Mapping[str, str]) -> None:
    """The sandbox's ``labels.json``: what ``termgym gc`` recognises a sandbox directory by."""
    (home / "labels.json").write_text(json.dumps({"termgym": "1", **dict(labels), "termgym.task": name}))


MODES = {"tmp": 0o1777, "var/tmp": 0o1777, "root": 0o700}  # the writable roots whose mode is not 0755


async def make_file_system(
    home: Path,
    resources: Resources,
    owner: int,
    directories: list[str],
    warnings: list[str],
    namespace: MountNamespace | None = None,
) -> tuple[SizedFilesystem | None, int | None]:
    """``home/fs`` on a file system of the task's storage size where this host allows it (mounted
    in ``namespace``, the sandbox's, when it has one), owned by the sandbox's user, holding
    ``directories``: ``(the sized file system, None)``, or ``(None, the per-file size limit in
    bytes)`` with a warning where it cannot be made."""
    fs = home / "fs"
    fs.mkdir()
    storage, file_size_limit = None, None
    try:
        storage = await uninterrupted(
            SizedFilesystem.create(
                home / "fs.img", fs, resources.storage_mb, owner, memory_mb=resources.memory_mb, namespace=namespace
            ),
            lambda made: made.remove(),
        )
    except OSError as exc:
        file_size_limit = resources.storage_mb << 20
        warnings.append(f"storage limit enforced per file only ({resources.storage_mb} MB a file): {exc}")
    for name in directories:
        path = reach(namespace, fs) / name
        path.mkdir(parents=True, exist_ok=True)
        os.chown(path, owner, owner if os.geteuid() == 0 else os.getgid())  # a user's group need not be its uid
        if name in MODES:  # as a Debian image has them: a USER other than root writes the temporary ones
            path.chmod(MODES[name])
    return storage, file_size_limit


def overlay_prepared(
    home: Path, entry: Entry, warnings: list[str], namespace: MountNamespace | None = None
) -> Path | None:
    """``home/root``: an overlay whose lower layer is the prepared ``entry`` and whose upper layer
    is on the sandbox's own storage (``home/fs/upper``, made with the file system), so the entry
    never changes, mounted in ``namespace`` (which holds the entry from then on: ``hold``) when
    there is one; None, with a warning, where no overlay can be mounted (a path an overlay cannot
    name, a file system it cannot stack on): the caller copies the entry instead."""
    fs, view = home / "fs", home / "root"
    view.mkdir()
    try:
        in_namespace(namespace, mount_overlay, entry.tree, fs / "upper", fs / "work", view)
        if namespace is not None:
            namespace.hold(entry.lock)
    except OSError as exc:
        warnings.append(f"started from a copy of the prepared environment (no overlay: {exc})")
        with contextlib.suppress(OSError):
            in_namespace(namespace, unmount, view)  # mounted, its entry not held
        for made in (view, fs / "upper", fs / "work"):
            reach(namespace, made).rmdir()
        return None
    return view


async def remove_home(
    home: Path | None, view: Path | None, storage: SizedFilesystem | None, namespace: MountNamespace | None = None
) -> None:
    """Unmount the overlay and the storage and remove the directory, whatever stage they reached.
    With the sandbox's ``namespace`` (no process of the sandbox left in it), letting it go unmounts
    both: the kernel tears down a namespace's mounts as its last descriptor closes; then the
    storage's image and the directory go, all in one thread. This process's lock on the directory
    goes last (``hold_home``), whatever happened: what is left of it is gc's from then on."""
    try:
        await _remove_home(home, view, storage, namespace)
    finally:
        if home is not None:
            release_home(home)


async def _remove_home(
    home: Path | None, view: Path | None, storage: SizedFilesystem | None, namespace: MountNamespace | None
) -> None:
    if namespace is not None:
        await asyncio.to_thread(_remove_with_namespace, namespace, storage, home)
        return
    if view is not None:
        with contextlib.suppress(OSError):
            await asyncio.to_thread(unmount, view)
    if storage is not None:
        await storage.remove()
    if home is not None:
        if is_mounted(home / "fs"):  # a mount made while a cancellation interrupted start()
            await asyncio.to_thread(unmount_sync, home / "fs")
        await asyncio.to_thread(remove_sandbox_dir, home)


def _remove_with_namespace(namespace: MountNamespace, storage: SizedFilesystem | None, home: Path | None) -> None:
    namespace.close()
    if storage is not None and storage.image is not None:
        with contextlib.suppress(OSError):
            storage.image.unlink()
    if home is not None:
        remove_sandbox_dir(home)


def remove_sandbox_dir(home: Path) -> None:
    """Remove a sandbox's directory, unmounted: its overlay's work directory (which the kernel
    leaves mode 000, which only root could enter) made reachable first. Blocking."""
    with contextlib.suppress(OSError):
        (home / "fs" / "work" / "work").chmod(0o700)
    if not remove_path(home) and (ids := subordinate_ids()) is not None:  # files of this user's range
        remove_mapped(ids, home)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name)[-40:].strip("-") or uuid.uuid4().hex[:8]
