"""Mounts the embedded backend makes on the host, by system call (no ``mount`` process to spawn).

``mount_tmpfs`` and ``mount_loop`` (an image file on a free loop device, detached by the kernel when
it is unmounted) make a sandbox's storage; ``mount_overlay`` puts a copy-on-write view of a
read-only lower directory at a mount point: reads see the lower files, writes land in the upper
directory (copied up first), deletions are whiteouts in the upper one; the lower directory never
changes. Mounted ``nosuid,nodev``. Needs root; ``OSError`` saying why otherwise (the caller copies
instead).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import functools
import os
import struct
from collections.abc import Sequence
from pathlib import Path

MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2
_UNSAFE = set(",:\\\n ")  # would break the overlay's option string


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4
LOOP_ATTEMPTS = 8  # another process may take the free device first


def _mount(source: str, target: Path, fstype: str, options: str) -> None:
    flags = MS_NOSUID | MS_NODEV
    if _libc().mount(source.encode(), os.fsencode(target), fstype.encode(), flags, options.encode() or None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mounting {fstype} at {target}: {os.strerror(code)}")


def mount_tmpfs(target: Path, options: str) -> None:
    """A ``tmpfs`` at ``target`` with ``options`` (``size=...,mode=...``)."""
    _mount("termgym", target, "tmpfs", options)


def mount_loop(image: Path, target: Path, fstype: str = "ext4", options: str = "") -> None:
    """The file system in ``image`` at ``target`` (with the file system's ``options``), through a
    free loop device that the kernel detaches when it is unmounted (``LO_FLAGS_AUTOCLEAR``)."""
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        control = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(LOOP_ATTEMPTS):
                number = fcntl.ioctl(control, LOOP_CTL_GET_FREE)
                device = f"/dev/loop{number}"
                loop = os.open(device, os.O_RDWR | os.O_CLOEXEC)
                try:
                    try:
                        fcntl.ioctl(loop, LOOP_CONFIGURE, _loop_config(backing))
                    except OSError as exc:
                        if exc.errno == errno.EBUSY:
                            continue  # taken meanwhile: ask for another
                        raise
                    try:
                        _mount(device, target, fstype, options)
                    except OSError:
                        fcntl.ioctl(loop, 0x4C01)  # LOOP_CLR_FD: free the device again
                        raise
                    return
                finally:
                    os.close(loop)  # the mount holds the device now
            raise OSError(errno.EBUSY, "no free loop device")
        finally:
            os.close(control)
    finally:
        os.close(backing)


def _loop_config(fd: int) -> bytes:
    """``struct loop_config``: the backing file, the default block size, ``loop_info64`` with
    only ``LO_FLAGS_AUTOCLEAR`` set, and the reserved words."""
    info = struct.pack("=5Q4I64s64s32s2Q", 0, 0, 0, 0, 0, 0, 0, 0, LO_FLAGS_AUTOCLEAR, b"", b"", b"", 0, 0)
    return struct.pack("=II", fd, 0) + info + bytes(64)


def mount_overlay(lower: Path | Sequence[Path], upper: Path, work: Path, target: Path) -> None:
    """Mount an overlay of ``lower`` (read-only; several: the first on top) and ``upper``
    (``work`` on the same file system) at ``target``."""
    lowers = [str(path) for path in ([lower] if isinstance(lower, Path) else lower)]
    paths = [*lowers, str(upper), str(work)]
    if any(_UNSAFE & set(path) for path in paths):
        raise OSError(f"an overlay cannot name {paths} (a comma, colon, backslash or space)")
    _mount("termgym", target, "overlay", f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}")


def unmount(target: Path) -> None:
    """Unmount ``target`` (lazily when it is busy); ``OSError`` when it is not a mount point."""
    path = os.fsencode(target)
    if _libc().umount2(path, 0) == 0:
        return
    if _libc().umount2(path, MNT_DETACH) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"unmounting {target}: {os.strerror(code)}")
