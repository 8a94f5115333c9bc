"""Trees the agent made, walked and removed from the host without recursion and within bounds.

A sandbox's files are the agent's: a directory chain 100,000 levels deep, a million empty files, a
name that is not UTF-8. Python's recursive ``shutil.rmtree`` raises ``RecursionError`` on the first
(about 1,000 levels), which is not an ``OSError`` and escapes every handler written for one. Here:

- ``remove_tree`` removes a tree iteratively, holding at most ``MAX_OPEN_DEPTH`` directory
  descriptors (a deeper directory is first moved up to the tree's top, to be removed from there),
  and raises ``TreeTooLarge`` (an ``OSError``) past ``limit`` entries: bounded in memory, in
  descriptors and in time, whatever the tree.
- ``walk`` lists a tree, pre-order, never following a symlink, and raises ``TreeTooLarge`` past
  ``max_entries`` entries or ``max_depth`` levels.
- ``remove_path`` is ``remove_tree`` on a host path, best effort (what it cannot remove stays),
  for a sandbox's own directory at its end and for garbage collection.

Every path is reached from a directory descriptor, one component at a time, never following a
symlink (``O_NOFOLLOW``), so nothing outside the tree is touched.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_OPEN_DEPTH = 64  # directory descriptors one removal holds at once
MAX_ENTRIES = 2_000_000  # entries one removal takes before it gives up: a bound on its time


class TreeTooLarge(OSError):
    """A tree holds more entries, or more levels, than the operation's bound."""


def remove_tree(parent: int, name: str, *, limit: int = MAX_ENTRIES) -> None:
    """Remove ``name`` in the directory ``parent`` (a descriptor), whatever it is: a file, a
    symlink (not its target), a tree of any depth. ``TreeTooLarge`` past ``limit`` entries; any
    other ``OSError`` as the system raises it (what was removed stays removed)."""
    try:
        info = os.stat(name, dir_fd=parent, follow_symlinks=False)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(info.st_mode):
        os.unlink(name, dir_fd=parent)
        return
    root = os.open(name, DIR_FLAGS, dir_fd=parent)
    stack: list[tuple[int, str]] = [(root, name)]  # each open directory and its name one level up
    removed = 0
    try:
        while stack:
            fd = stack[-1][0]
            batch = _some_entries(fd)
            if not batch:  # empty now: removed from the level above
                fd, entry = stack.pop()
                os.close(fd)
                os.rmdir(entry, dir_fd=stack[-1][0] if stack else parent)
                continue
            for entry, is_dir in batch:
                removed += 1
                if removed > limit:
                    raise TreeTooLarge(errno.EFBIG, f"more than {limit} entries to remove")
                if not is_dir:
                    os.unlink(entry, dir_fd=fd)
                elif len(stack) < MAX_OPEN_DEPTH or not _moved_up(fd, entry, root):
                    stack.append((os.open(entry, DIR_FLAGS, dir_fd=fd), entry))
                    break  # the rest of this directory is listed again once that one is gone
    finally:
        for fd, _ in stack:
            os.close(fd)


def _some_entries(fd: int, count: int = 1024) -> list[tuple[str, bool]]:
    """Up to ``count`` entries of the directory ``fd``: their names, and whether each is a directory."""
    with os.scandir(fd) as entries:
        return [(entry.name, entry.is_dir(follow_symlinks=False)) for entry in itertools.islice(entries, count)]


def _moved_up(fd: int, name: str, top: int) -> bool:
    """Move the directory ``name`` of ``fd`` into ``top`` (under a fresh name), where it is
    reached again without holding the levels between; False where it cannot be (a directory an
    overlay keeps in its lower layer): it is then descended into where it is."""
    try:
        os.rename(name, f".termgym-deep-{uuid.uuid4().hex}", src_dir_fd=fd, dst_dir_fd=top)
    except OSError:
        return False
    return True


def remove_path(path: Path, *, limit: int = MAX_ENTRIES) -> bool:
    """Remove ``path`` (a tree or a file; a symlink itself) on the host, best effort: True when it
    is gone. Never raises ``OSError``."""
    try:
        parent = os.open(path.parent, DIR_FLAGS)
    except OSError:
        return not os.path.lexists(path)
    try:
        remove_tree(parent, path.name, limit=limit)
    except OSError:
        pass
    finally:
        os.close(parent)
    return not os.path.lexists(path)


def walk(top: int, *, max_entries: int, max_depth: int) -> Iterator[tuple[str, os.stat_result, int, str]]:
    """Every entry under the directory ``top`` (a descriptor), pre-order, as ``(path relative to
    top, its lstat, the descriptor of its directory, its name)``; the descriptor is valid only
    until the next item. Never follows a symlink. ``TreeTooLarge`` past ``max_entries`` entries
    or below ``max_depth`` levels."""
    stack: list[tuple[int, str, Iterator[str]]] = []
    seen = 0

    def listing(fd: int) -> Iterator[str]:  # never more names than the walk may still take
        with os.scandir(fd) as entries:
            return iter([entry.name for entry in itertools.islice(entries, max_entries - seen + 1)])

    try:
        stack.append((os.dup(top), "", listing(top)))
        while stack:
            fd, prefix, entries = stack[-1]
            name = next(entries, None)
            if name is None:
                stack.pop()
                os.close(fd)
                continue
            seen += 1
            if seen > max_entries:
                raise TreeTooLarge(errno.EFBIG, f"more than {max_entries} entries")
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            relative = f"{prefix}{name}"
            yield relative, info, fd, name
            if stat.S_ISDIR(info.st_mode):
                if len(stack) >= max_depth:
                    raise TreeTooLarge(errno.ELOOP, f"deeper than {max_depth} levels")
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
                try:
                    names = listing(child)
                except OSError:
                    os.close(child)
                    raise
                stack.append((child, f"{relative}/", names))
    finally:
        for fd, _, _ in stack:
            with contextlib.suppress(OSError):
                os.close(fd)
