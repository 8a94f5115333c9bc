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
empty. Nothing is memoized: every call reads every byte.

Why nothing is memoized, and what that costs:
docs/results/warm-pool.md#the-recipe-keys-cost-issue-42."""

from __future__ import annotations

import hashlib
import os
import stat
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
            put("file", relative, mode, file_sha256(path))
        elif stat.S_ISDIR(info.st_mode):
            put("dir", relative, mode)
        else:
            put("other", relative, mode, str(stat.S_IFMT(info.st_mode)))
    return digest.hexdigest()


def file_sha256(path: Path) -> bytes:
    """The SHA-256 of a file's bytes, read in chunks (symlinks not followed)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as file:
        return hashlib.file_digest(file, "sha256").digest()


def _relative(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()
