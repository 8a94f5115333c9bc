"""The content hash of a build context: the one value every key of an environment recipe is made
from (the Docker build's image tag, the embedded backend's prepared environments and both warm
pools' recipes).

Guaranteed: ``context_digest`` is a function of what the context holds, never of when or how it was
written. Two contexts get the same digest only when they have the same entries (relative names,
compared byte for byte), each of the same kind (directory, regular file, symlink or other) with the
same permission bits (``mode & 0o7777``), every regular file with the same bytes and every symlink
with the same target (a SHA-256 collision aside). Names, sizes, times, owners and inode numbers
alone never make two contexts equal, and the encoding is framed (every field length-prefixed, one
SHA-256 per file). Symlinks are hashed as links, never followed. ``skip_git`` leaves out any path
with a ``.git`` component; no other ignore file is read (no builder here honours
``.dockerignore``). A directory that cannot be read raises ``OSError`` rather than hashing as
empty.

A regular file's bytes are read once per process where its times have settled (``file_sha256``
says what that leaves): docs/results/warm-pool.md#the-recipe-keys-cost-issue-42."""

from __future__ import annotations

import hashlib
import os
import stat
import time
from pathlib import Path

FORMAT = b"termgym-context-1"


def context_files(context_dir: Path, *, skip_git: bool = False) -> list[Path]:
    """Every path under ``context_dir`` (directories, files, symlinks; symlinked directories not
    entered), sorted by relative name; with ``skip_git`` none with a ``.git`` component."""

    def failed(error: OSError) -> None:
        raise error

    found = []
    for directory, dirs, files in os.walk(context_dir, onerror=failed):
        if skip_git:
            dirs[:] = [name for name in dirs if name != ".git"]
            files = [name for name in files if name != ".git"]
        found += [Path(directory, name) for name in dirs + files]
    return sorted(found, key=lambda path: _relative(path, context_dir))


def context_digest(context_dir: Path | None, *, skip_git: bool = False) -> str:
    """The SHA-256 (hex) of ``context_dir``'s content (module docstring); that of an empty context
    for None."""
    digest = hashlib.sha256()

    def put(*fields: bytes | str) -> None:
        for field in fields:
            data = field.encode("utf-8", "surrogateescape") if isinstance(field, str) else field
            digest.update(len(data).to_bytes(8, "little") + data)

    put(FORMAT)
    if context_dir is None:
        return digest.hexdigest()
    for path in context_files(context_dir, skip_git=skip_git):
        info = path.lstat()
        relative, mode = _relative(path, context_dir), oct(stat.S_IMODE(info.st_mode))
        if stat.S_ISLNK(info.st_mode):
            put("link", relative, mode, os.readlink(path))
        elif stat.S_ISREG(info.st_mode):
            put("file", relative, mode, file_sha256(path, info))
        elif stat.S_ISDIR(info.st_mode):
            put("dir", relative, mode)
        else:
            put("other", relative, mode, str(stat.S_IFMT(info.st_mode)))
    return digest.hexdigest()


SETTLED_NS = 2_000_000_000  # a file's times older than this when it is hashed: its digest is remembered
_MAX_REMEMBERED = 65_536
_REMEMBERED: dict[tuple[int, int, int, int, int], bytes] = {}  # (dev, inode, size, mtime, ctime) -> SHA-256


def file_sha256(path: Path, seen: os.stat_result | None = None) -> bytes:
    """The SHA-256 of a file's bytes, read in chunks (symlinks not followed); remembered for this
    process by the open file's device, inode, size, mtime and ctime where both times were at least
    ``SETTLED_NS`` old when it was read. No metadata proves a file rewritten within one timestamp
    tick unchanged, so a younger one is read at every call; once settled, any write sets its ctime,
    which no process can set back, past the one remembered. Left: a realtime clock stepped back
    past it and a write landing on that very tick. ``seen``: the file's ``lstat`` the caller took,
    whose remembered digest is returned without opening it."""
    if seen is not None and (known := _REMEMBERED.get(_identity(seen))) is not None:
        return known
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        identity = _identity(info)
        if (known := _REMEMBERED.get(identity)) is not None:
            return known
        digest = hashlib.file_digest(file, "sha256").digest()
    if time.time_ns() - max(info.st_mtime_ns, info.st_ctime_ns) >= SETTLED_NS:
        if len(_REMEMBERED) >= _MAX_REMEMBERED:
            _REMEMBERED.clear()
        _REMEMBERED[identity] = digest
    return digest


def _identity(info: os.stat_result) -> tuple[int, int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def forget_file_digests() -> None:
    """Forget every digest ``file_sha256`` remembered (the next call of each reads the bytes)."""
    _REMEMBERED.clear()


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()
