"""Locks between the processes that share the embedded backend's caches: ``flock`` on a file,
waited for without blocking the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

LOCK_POLL_SEC = 0.02


@contextlib.asynccontextmanager
async def file_lock(path: Path, mode: int, timeout: float, what: str) -> AsyncIterator[None]:
    """Hold ``flock(mode)`` on ``path`` (made if missing) for the block (``acquire``)."""
    fd = await acquire(path, mode, timeout, what)
    try:
        yield
    finally:
        os.close(fd)  # releases the lock


async def acquire(path: Path, mode: int, timeout: float, what: str) -> int:
    """``flock(mode)`` on ``path`` (made if missing), held by the descriptor returned until it is
    closed (by whoever the caller hands it to, a thread too). ``TimeoutError`` naming ``what`` when
    another process holds it for ``timeout`` seconds. A lock file unlinked by another process after
    this one opened it is opened again, so two holders never lock two files."""
    deadline = time.monotonic() + timeout
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} stayed locked for {timeout:g}s") from None
            await asyncio.sleep(LOCK_POLL_SEC)
            continue
        if _same_file(fd, path):
            return fd
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    """Whether the open ``fd`` is still the file at ``path``."""
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except OSError:
        return False
