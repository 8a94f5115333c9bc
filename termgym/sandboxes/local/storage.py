"""The embedded backend's storage limit: a sandbox's writable directories on a file system of the
task's size.

Guarantees, where ``SizedFilesystem.create`` succeeds: the writable directories live on a fresh
file system of ``storage_mb``, mounted ``nosuid,nodev`` in the sandbox's own mount namespace
(``termgym.sandboxes.local.namespace``; in this process's where it has none), owned by the sandbox's user;
writing past it fails with "No space left on device" inside the sandbox; ``full`` says whether the
sandbox reached it; ``remove`` unmounts it and frees what it held. A storage of at most a quarter of
the task's memory is a ``tmpfs`` (in memory, so what the agent stores also counts against its memory
limit: a mount costs about a millisecond); a larger one is an ext4 file system in a sparse image file
(no journal, no blocks reserved for root or for growing it) on a loop device: a copy of an empty
image made once per size (its metadata, 228 KB at 10 GB, copied in the kernel, no ``mkfs`` per
sandbox). It needs root (and a loop device for ext4); where that is missing, ``create`` raises
``OSError`` and the caller falls back to a per-file size limit, with a warning in the record.

Every tool is run by absolute path with a fixed environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import secrets
from pathlib import Path

from termgym.sandboxes.local.env_cache import cache_root
from termgym.sandboxes.local.mounts import mount_loop, mount_tmpfs, unmount
from termgym.sandboxes.local.namespace import MountNamespace, in_namespace, reach
from termgym.sandboxes.tools import host_tool

FULL_BELOW_BYTES = 1 << 20  # less room left than this: the sandbox reached its storage limit


class SizedFilesystem:
    def __init__(
        self, image: Path | None, mountpoint: Path, size_mb: int, namespace: MountNamespace | None = None
    ) -> None:
        self.image = image  # None for a tmpfs
        self.mountpoint = mountpoint  # as the namespace sees it
        self.size_mb = size_mb
        self.namespace = namespace  # the sandbox's mount namespace; None: this process's

    @classmethod
    async def create(
        cls,
        image: Path,
        mountpoint: Path,
        size_mb: int,
        owner: int,
        *,
        memory_mb: int,
        namespace: MountNamespace | None = None,
    ) -> SizedFilesystem:
        """Make, mount (in ``namespace``, else here) and hand over to uid and gid ``owner`` a file
        system of ``size_mb`` at ``mountpoint`` (an empty directory), in memory when ``size_mb`` is at
        most a quarter of ``memory_mb``, else in the image file ``image``; ``OSError`` saying why
        when that is not possible."""
        if os.geteuid() != 0:
            raise OSError("mounting a file system needs root")
        if size_mb * 4 <= memory_mb:
            options = f"size={size_mb}m,mode=0755,uid={owner},gid={owner}"
            await asyncio.to_thread(in_namespace, namespace, mount_tmpfs, mountpoint, options)
            return cls(None, mountpoint, size_mb, namespace)
        if not Path("/dev/loop-control").exists():
            raise OSError("the host has no loop devices (/dev/loop-control)")
        try:
            await asyncio.to_thread(_copy_sparse, await _template(cache_root() / "storage", size_mb), image)
            await asyncio.to_thread(in_namespace, namespace, mount_loop, image, mountpoint, "ext4", EXT4_OPTIONS)
        except OSError:
            with contextlib.suppress(OSError):
                image.unlink()
            raise
        try:
            os.chown(reach(namespace, mountpoint), owner, owner)  # the file system's root, now mounted there
        except OSError:
            with contextlib.suppress(OSError):
                in_namespace(namespace, unmount, mountpoint)  # detaches the loop device too
                image.unlink()
            raise
        return cls(image, mountpoint, size_mb, namespace)

    def full(self) -> bool:
        try:
            stats = os.statvfs(reach(self.namespace, self.mountpoint))
        except OSError:
            return False
        return stats.f_bavail * stats.f_frsize < FULL_BELOW_BYTES

    async def remove(self) -> None:
        """Unmount (lazily, if something still holds it) and delete the image; idempotent."""
        if self.namespace is not None:
            if not self.namespace.closed:  # closed: its mounts went with it
                with contextlib.suppress(OSError):  # not mounted (any more)
                    await asyncio.to_thread(self.namespace.run, unmount, self.mountpoint)
        elif is_mounted(self.mountpoint):
            with contextlib.suppress(OSError):
                unmount(self.mountpoint)  # lazily when busy; a loop device is detached with it
        if self.image is not None:
            with contextlib.suppress(OSError):
                await asyncio.to_thread(self.image.unlink)  # freeing its blocks takes a while: off the event loop


# The file system lives and dies with its sandbox, so nothing it holds must ever survive a crash:
# no cache flushes (``barrier=0``: each would make the loop device write the image to the host's
# disk; an unmount took 2.2 ms with them, 1.1 ms without), and no kernel thread zeroing its inode
# tables in the background of a long episode (``noinit_itable``: holes in the image, read as zeros).
EXT4_OPTIONS = "barrier=0,noinit_itable"

# No journal, no blocks reserved for root, inode tables left unwritten, and no blocks reserved for
# growing the file system online (``resize_inode``: a sandbox's is never resized; at 10 GB those
# reserved descriptor blocks were 4.1 of the image's 4.3 MB, copied for every sandbox and freed at
# its end).
MKFS_OPTIONS = ("-q", "-F", "-m", "0", "-O", "^has_journal,^resize_inode", "-E", "lazy_itable_init=1")


async def _template(root: Path, size_mb: int) -> Path:
    """An empty ext4 image of ``size_mb`` (no journal, no blocks reserved for root) under
    ``root``, made once per size and options: a sandbox's image is a sparse copy of it
    (a few MB of metadata to copy instead of a ``mkfs`` to run)."""
    name = hashlib.blake2b(" ".join(MKFS_OPTIONS).encode(), digest_size=6).hexdigest()
    template = root / f"ext4-{size_mb}m-{name}.img"
    if template.exists():
        return template
    template.parent.mkdir(parents=True, exist_ok=True)
    partial = template.with_name(f".{template.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        with open(partial, "wb") as handle:
            handle.truncate(size_mb << 20)
        await _run(host_tool("mkfs.ext4"), *MKFS_OPTIONS, str(partial))
        partial.replace(template)  # whole or not at all; two makers at once both make a good one
    finally:
        with contextlib.suppress(OSError):
            partial.unlink()
    return template


def _copy_sparse(source: Path, target: Path) -> None:
    """Copy ``source`` to a new ``target`` of the same size, its holes kept holes (in the kernel)."""
    with open(source, "rb") as src, open(target, "xb") as dst:
        size = os.fstat(src.fileno()).st_size
        dst.truncate(size)
        offset = 0
        while offset < size:
            try:
                start = os.lseek(src.fileno(), offset, os.SEEK_DATA)
            except OSError:
                break  # no data after offset
            end = os.lseek(src.fileno(), start, os.SEEK_HOLE)
            position = start
            while position < end:
                copied = os.copy_file_range(src.fileno(), dst.fileno(), end - position, position, position)
                if copied == 0:
                    break
                position += copied
            offset = end


def is_mounted(path: Path) -> bool:
    """True when ``path`` is a mount point in this process's mount namespace."""
    target = os.path.realpath(path)
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            if len(fields) > 4 and fields[4].replace("\\040", " ") == target:
                return True
    return False


def unmount_sync(path: Path) -> None:
    """Unmount ``path`` if it is a mount point (for garbage collection, outside any event loop)."""
    import subprocess

    if is_mounted(path):
        subprocess.run([host_tool("umount"), "-l", str(path)], env=_ENV, capture_output=True, check=False)


_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}


async def _run(*argv: str) -> None:
    process = await asyncio.create_subprocess_exec(
        *argv,
        env=_ENV,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    output, _ = await process.communicate()
    if process.returncode != 0:
        last = output.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {process.returncode}"]
        raise OSError(f"{Path(argv[0]).name} failed: {last[0][:200]}")
