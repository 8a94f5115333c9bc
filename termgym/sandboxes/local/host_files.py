"""The verifier's files, reached from the host when no process runs in the sandbox (embedded).

The embedded backend's writable roots are host directories: while the sandbox holds no process
(after ``kill_agent_processes``, before the next command), the harness may reset ``/tests`` and
``/logs/verifier``, write the tests and read the reports there directly, instead of running a
command in the sandbox for each. The tree is the agent's: every path is walked one component at a
time from a directory descriptor, never following a symlink (``O_NOFOLLOW``), never opening what
is not a regular file or a directory (a FIFO, a device), so nothing outside ``root`` is read,
written or removed, whatever the agent made of those paths. Whatever is created belongs to
``owner`` (the sandbox's root), as if the sandbox had made it.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
import tarfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path, PurePosixPath

from termgym.sandboxes.local.host_trees import DIR_FLAGS, remove_tree, walk

_DIR = DIR_FLAGS
MAX_ARCHIVED = 100_000  # entries one archive of artifacts may hold
MAX_ARCHIVE_DEPTH = 64  # levels below a declared artifact path
MAX_WATCHED = 200_000  # entries a manifest of watched paths may hold


class LocalHostFiles:
    """Safe file operations on the sandbox's tree at ``root`` (see the module's guarantees)."""

    def __init__(self, root: Path, owner: int) -> None:
        self.root = root
        self.owner = owner

    def fresh_dirs(self, paths: Sequence[str]) -> None:
        """Make each absolute ``path`` a fresh empty directory, whatever is there now (a file, a
        symlink, a full tree); its missing parents are made, a parent that is not a directory is
        replaced. A top-level directory (a sandbox's mount point) is emptied in place. ``OSError``
        when that is impossible."""
        for path in paths:
            *parents, name = PurePosixPath(path).relative_to("/").parts
            with self._directory(parents, make=True) as parent:
                if not parents and _is_dir(parent, name):
                    # A top-level directory is a running sandbox's mount point: emptied, never replaced.
                    with self._directory([name], make=False) as top:
                        for entry in os.listdir(top):
                            _remove(top, entry)
                    continue
                _remove(parent, name)
                os.mkdir(name, 0o755, dir_fd=parent)
                os.chown(name, *_owners(self.owner), dir_fd=parent, follow_symlinks=False)

    def make_missing_dirs(self, path: str) -> None:
        """Make the directories of the absolute ``path`` that are missing, as a container engine
        makes a working directory its image lacks; a link or a file in the way is left as it is
        (nothing is followed or replaced, so nothing outside ``root`` is reached)."""
        fd = os.open(self.root, _DIR)
        try:
            for part in PurePosixPath(path).relative_to("/").parts:
                try:
                    child = os.open(part, _DIR, dir_fd=fd)
                except FileNotFoundError:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    os.chown(part, *_owners(self.owner), dir_fd=fd, follow_symlinks=False)
                    child = os.open(part, _DIR, dir_fd=fd)
                except OSError:  # a link or a file: the image's, not changed here
                    return
                os.close(fd)
                fd = child
        finally:
            os.close(fd)

    def write_files(self, dest: str, files: Sequence[tuple[str, bytes, int]]) -> None:
        """Write ``(relative path, content, mode)`` under the directory ``dest`` (made fresh by
        ``fresh_dirs`` first: nothing is overwritten), making parent directories."""
        base = PurePosixPath(dest).relative_to("/").parts
        for relative, content, mode in files:
            *parents, name = PurePosixPath(relative).parts
            if ".." in parents or name in ("", ".", ".."):
                raise OSError(errno.EINVAL, f"not a relative path: {relative}")
            with self._directory([*base, *parents], make=True) as parent:
                fd = os.open(
                    name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent
                )
                try:
                    view = memoryview(content)
                    while view:
                        view = view[os.write(fd, view) :]
                    os.fchown(fd, *_owners(self.owner))
                    os.fchmod(fd, mode & 0o777)
                finally:
                    os.close(fd)

    def list_files(self, directory: str, wanted: Callable[[str], bool]) -> list[str] | None:
        """The names ``wanted`` accepts of the regular files (not symlinks) at the top of
        ``directory``, sorted; None when ``directory`` is not a directory (or is a symlink)."""
        try:
            with self._directory(PurePosixPath(directory).relative_to("/").parts, make=False) as parent:
                names = []
                for name in sorted(os.listdir(parent)):
                    with contextlib.suppress(OSError):
                        if wanted(name) and stat.S_ISREG(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                            names.append(name)
                return names
        except OSError:
            return None

    def read_files(self, directory: str, names: Sequence[str], cap: int) -> dict[str, bytes]:
        """The regular files ``names`` at the top of ``directory``, each cut at ``cap`` bytes;
        a name that is no longer a regular file is left out."""
        found: dict[str, bytes] = {}
        with self._directory(PurePosixPath(directory).relative_to("/").parts, make=False) as parent:
            for name in names:
                try:
                    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
                except OSError:
                    continue  # a symlink, or gone
                try:
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        found[name] = _read_up_to(fd, cap)
                finally:
                    os.close(fd)
        return found

    def archive(self, paths: Sequence[str], limit: int) -> bytes:
        """A tar archive of those of the absolute ``paths`` that exist and everything under them,
        named relative to ``/`` as ``tar -C /`` names them: regular files with their content,
        directories, symlinks as links (never followed), other files by type only. ``OSError``
        when the regular files' sizes add up to more than ``limit`` bytes (a sparse file counts at
        its size, and is never read), or past ``MAX_ARCHIVED`` entries or ``MAX_ARCHIVE_DEPTH``
        levels: bounded in time and memory, whatever the tree."""
        out = io.BytesIO()
        budget = [limit]
        archived = False
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target:
            for path in paths:
                *parents, name = PurePosixPath(path).relative_to("/").parts
                try:
                    with self._directory(parents, make=False) as parent:
                        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                        relative = "/".join([*parents, name])
                        _add_member(target, parent, name, relative, info, budget)
                        archived = True
                        if stat.S_ISDIR(info.st_mode):
                            top = os.open(name, DIR_FLAGS, dir_fd=parent)
                            try:
                                for below, entry, fd, entry_name in walk(
                                    top, max_entries=MAX_ARCHIVED, max_depth=MAX_ARCHIVE_DEPTH
                                ):
                                    _add_member(target, fd, entry_name, f"{relative}/{below}", entry, budget)
                            finally:
                                os.close(top)
                except (FileNotFoundError, NotADirectoryError):
                    continue  # not there (a parent not a directory, or a symlink: not followed)
        return out.getvalue() if archived else b""

    def manifest(self, paths: Sequence[str], *, max_entries: int = MAX_WATCHED) -> dict[str, tuple[int, ...]]:
        """Each of the absolute ``paths`` that exists and everything under it, as ``{absolute path:
        (mode, inode, size, ctime in ns)}``: the change time moves with every write, chmod, rename
        or link, and no process can set it back, so two manifests differ wherever the tree was
        changed between them. ``OSError`` past ``max_entries`` entries."""
        found: dict[str, tuple[int, ...]] = {}
        for path in paths:
            *parents, name = PurePosixPath(path).relative_to("/").parts
            try:
                with self._directory(parents, make=False) as parent:
                    info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                    found[path] = _fingerprint(info)
                    if stat.S_ISDIR(info.st_mode):
                        top = os.open(name, DIR_FLAGS, dir_fd=parent)
                        try:
                            for below, entry, _, _ in walk(top, max_entries=max_entries, max_depth=MAX_ARCHIVE_DEPTH):
                                found[f"{path}/{below}"] = _fingerprint(entry)
                        finally:
                            os.close(top)
            except (FileNotFoundError, NotADirectoryError):
                continue
        return found

    @contextlib.contextmanager
    def _directory(self, parts: Sequence[str], *, make: bool) -> Iterator[int]:
        """A descriptor of ``root/parts`` reached without following a symlink; with ``make``,
        missing directories are made and what is not a directory in the way is replaced."""
        fd = os.open(self.root, _DIR)
        try:
            for part in parts:
                try:
                    child = os.open(part, _DIR, dir_fd=fd)
                except OSError as exc:
                    if not make or exc.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        raise
                    _remove(fd, part)
                    os.mkdir(part, 0o755, dir_fd=fd)
                    os.chown(part, *_owners(self.owner), dir_fd=fd, follow_symlinks=False)
                    child = os.open(part, _DIR, dir_fd=fd)
                os.close(fd)
                fd = child
            yield fd
        finally:
            os.close(fd)


def _is_dir(parent: int, name: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _remove(parent: int, name: str) -> None:
    """Remove ``name`` in the directory ``parent``, whatever it is (a tree of any depth, without
    following links; ``termgym.sandboxes.local.host_trees.remove_tree``)."""
    remove_tree(parent, name)


def _owners(owner: int) -> tuple[int, int]:
    """The uid and gid of a file made for the sandbox whose root is the host uid ``owner``: as root,
    ``owner`` twice; otherwise this user and its group (whose id need not be its uid's)."""
    return (owner, owner) if os.geteuid() == 0 else (owner, os.getgid())


def _fingerprint(info: os.stat_result) -> tuple[int, ...]:
    return (info.st_mode, info.st_ino, info.st_size, info.st_ctime_ns)


def _add_member(
    target: tarfile.TarFile, parent: int, name: str, relative: str, info: os.stat_result, budget: list[int]
) -> None:
    """``name`` in the directory ``parent`` added to ``target`` as ``relative``; a regular file's
    size taken from ``budget[0]`` (``OSError`` when it does not fit)."""
    member = tarfile.TarInfo(relative)
    member.mode, member.mtime = info.st_mode & 0o7777, int(info.st_mtime)
    member.uid = member.gid = 0
    content = None
    if stat.S_ISREG(info.st_mode):
        if info.st_size > budget[0]:
            raise OSError(errno.EFBIG, f"the files add up to more than the limit ({relative})")
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        try:
            data = _read_up_to(fd, info.st_size)
        finally:
            os.close(fd)
        budget[0] -= len(data)
        member.size, content = len(data), io.BytesIO(data)
    elif stat.S_ISDIR(info.st_mode):
        member.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(info.st_mode):
        member.type, member.linkname = tarfile.SYMTYPE, os.readlink(name, dir_fd=parent)
    elif stat.S_ISFIFO(info.st_mode):
        member.type = tarfile.FIFOTYPE
    elif stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        member.type = tarfile.CHRTYPE if stat.S_ISCHR(info.st_mode) else tarfile.BLKTYPE
    else:
        return  # a socket: nothing an archive can name
    target.addfile(member, content)


def _read_up_to(fd: int, cap: int) -> bytes:
    chunks, left = [], cap
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def overlay_changes(upper: dict[str, tuple[int, ...]], lower: Path | Sequence[Path]) -> dict[str, str]:
    """``{path: A|C|D}`` from the manifest of an overlay's upper layer (``LocalHostFiles.manifest``,
    parents before children) and its lower directories: a character device is a whiteout (a
    deletion; nothing in a sandbox can make another kind of device), an entry a lower layer has is
    changed, any other is added (and so is all under it, without looking: a tree of any depth)."""
    lowers = [lower] if isinstance(lower, Path) else list(lower)
    changes: dict[str, str] = {}
    for path, (mode, *_) in upper.items():
        parent = path.rsplit("/", 1)[0]
        if stat.S_ISCHR(mode):
            changes[path] = "D"
        elif changes.get(parent) == "A" or not any(_in_lower(layer, path) for layer in lowers):
            changes[path] = "A"
        else:
            changes[path] = "C"
    return changes


def changes_since(
    changes: dict[str, str], before: dict[str, tuple[int, ...]], upper: dict[str, tuple[int, ...]]
) -> dict[str, str]:
    """``changes`` (``overlay_changes`` of the upper layer ``upper``) less what the upper layer
    already held, unchanged, when its manifest was ``before``; what was there then and is gone now
    is a deletion."""
    since = {path: kind for path, kind in changes.items() if before.get(path) != upper.get(path)}
    since.update({path: "D" for path in before.keys() - upper.keys()})
    return since


def _in_lower(lower: Path, path: str) -> bool:
    """Whether the overlay's lower directory has ``path`` (absolute as the sandbox sees it), each
    component reached from its directory's descriptor (no path too long, no link followed)."""
    *parents, name = PurePosixPath(path).relative_to("/").parts
    fd = os.open(lower, DIR_FLAGS)
    try:
        for part in parents:
            try:
                child = os.open(part, DIR_FLAGS, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                return False
            os.close(fd)
            fd = child
        try:
            os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(fd)
