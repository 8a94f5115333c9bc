"""The embedded backend's prepared environments: a task's Dockerfile subset run once per content
hash, every later trial started from the result copy-on-write.

Guarantees: ``environment_key`` hashes every byte a preparation reads (no size or time stands in
for content), so a change is another key and an old entry is never served for it; an entry is
visible only once complete; ``building`` holds the key's exclusive lock across processes, so one
task is prepared once; at most ``max_entries`` entries and ``max_bytes`` bytes but for entries in
use, across processes (each entry counted under the cache's lock before it appears: a count never
below what is there, checked by each ``publish`` without reading every entry), least recently used
removed first; an entry is removed only while no trial holds it and no mount has it as a lower
layer. Trials started from one entry run as its owner (the host uid that prepared it).

Layout under ``cache_root() / "envs"`` and the guarantees in full:
docs/guides/backends.md#prepared-environments-the-embedded-backends-cache."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from termgym.images.context import context_digest, file_sha256
from termgym.sandboxes.host_processes import end_process, spawn
from termgym.sandboxes.local.host import sandbox_root_dir
from termgym.sandboxes.local.locks import acquire, file_lock
from termgym.sandboxes.local.namespace import namespace_mountinfos
from termgym.sandboxes.local.subids import SubIds, mapped_argv, remove_mapped, subordinate_ids
from termgym.sandboxes.tools import host_tool

FORMAT = 3  # bump when what an entry holds or how a preparation runs changes (3: /tmp is 1777)
DEFAULT_MAX_MB = 4096
DEFAULT_MAX_ENTRIES = 256
_PACKAGES = Path("/var/lib/dpkg/status")
_USAGE = ".usage"  # the entries' count, bytes and next candidates for eviction; its flock is the cache's lock
_CANDIDATES = 32  # the least recently used a full pass notes, evicted later without reading every entry
_USAGE_TIMEOUT = 60.0  # how long a publish waits for other processes' bookkeeping, then keeps nothing


@dataclass(frozen=True)
class Entry:
    """A prepared environment: its ``tree`` holds one directory per writable root."""

    key: str
    path: Path
    owner: int
    roots: tuple[str, ...]
    env: dict[str, str]
    workdir: str
    bytes: int

    @property
    def tree(self) -> Path:
        return self.path / "tree"

    @property
    def lock(self) -> Path:
        """Its lock file (``EnvCache``'s layout): shared while a trial or a sandbox holds it."""
        return self.path.with_name(f"{self.key}.lock")


@dataclass
class _Usage:
    """What the entries take: as the last full pass (``EnvCache._full_pass``) counted them, plus
    each entry published since, less each evicted since. ``oldest``: that pass's least recently
    used entries not evicted yet, oldest first, as (key, its ``meta.json``'s mtime then, bytes)."""

    entries: int
    bytes: int
    oldest: list[tuple[str, int, int]]


def cache_root() -> Path:
    """What the embedded backend keeps between trials (prepared environments in ``envs``, empty
    storage images in ``storage``): ``TERMGYM_ENV_CACHE_DIR``, else ``<sandbox dir>/cache``
    (``termgym.sandboxes.local.host.sandbox_root_dir``)."""
    configured = os.environ.get("TERMGYM_ENV_CACHE_DIR")
    if configured:
        return Path(configured)
    return sandbox_root_dir() / "cache"


def cache_enabled() -> bool:
    return os.environ.get("TERMGYM_ENV_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def environment_key(
    dockerfile: bytes, context_dir: Path | None, env: Mapping[str, str], roots: Sequence[str], *, base: str = "host"
) -> str:
    """The content hash of a preparation: everything it reads (see the module's guarantees);
    ``base`` is the image's digest when it runs over an image rather than the host's system."""
    digest = hashlib.blake2b(digest_size=20)

    def put(*parts: bytes | str) -> None:
        for part in parts:
            data = part.encode() if isinstance(part, str) else part
            digest.update(len(data).to_bytes(8, "little") + data)

    put(f"termgym-env-{FORMAT}", dockerfile, json.dumps(sorted(env.items())), json.dumps(list(roots)))
    if base == "host":
        with contextlib.suppress(OSError):
            put("packages", file_sha256(_PACKAGES))
    else:
        put("image", base)
    put("context", context_digest(context_dir))
    return digest.hexdigest()


def _walk(root: Path) -> Iterator[Path]:
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            yield Path(directory) / name


class EnvCache:
    """The prepared environments under ``root`` (see the module's guarantees)."""

    def __init__(self, root: Path, *, max_bytes: int, max_entries: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        self.max_entries = max_entries

    @classmethod
    def from_environment(cls) -> EnvCache:
        return cls(
            cache_root() / "envs",
            max_bytes=int(os.environ.get("TERMGYM_ENV_CACHE_MB") or DEFAULT_MAX_MB) << 20,
            max_entries=int(os.environ.get("TERMGYM_ENV_CACHE_ENTRIES") or DEFAULT_MAX_ENTRIES),
        )

    # -- reading ---------------------------------------------------------------------------------

    def lookup(self, key: str) -> Entry | None:
        """The complete entry for ``key``, marked used now; None when there is none."""
        entry = self._read(key)
        if entry is not None:
            with contextlib.suppress(OSError):
                os.utime(entry.path / "meta.json")  # least recently used goes first
        return entry

    def _read(self, key: str) -> Entry | None:
        path = self.root / key
        try:
            meta = json.loads((path / "meta.json").read_text())
            return Entry(
                key=key,
                path=path,
                owner=int(meta["owner"]),
                roots=tuple(meta["roots"]),
                env=dict(meta["env"]),
                workdir=str(meta["workdir"]),
                bytes=int(meta["bytes"]),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None

    @contextlib.asynccontextmanager
    async def holding(self, key: str, timeout: float) -> AsyncIterator[Entry | None]:
        """The entry for ``key`` (None when there is none), held (shared lock) until the block
        ends, so no eviction removes it before it is mounted or copied."""
        async with self._locked(key, fcntl.LOCK_SH, timeout):
            yield self.lookup(key)

    @contextlib.asynccontextmanager
    async def building(self, key: str, timeout: float) -> AsyncIterator[Entry | None]:
        """The key's exclusive lock for one preparation: yields the entry when another trial made
        it meanwhile (then nothing is to be built), else None (build, then ``publish``).
        ``TimeoutError`` when the lock stays taken for ``timeout`` seconds."""
        async with self._locked(key, fcntl.LOCK_EX, timeout):
            yield self.lookup(key)

    def _locked(self, key: str, mode: int, timeout: float) -> contextlib.AbstractAsyncContextManager[None]:
        self.root.mkdir(parents=True, exist_ok=True)
        return file_lock(self.root / f"{key}.lock", mode, timeout, f"the prepared environment {key[:12]}")

    # -- writing ---------------------------------------------------------------------------------

    async def publish(
        self,
        key: str,
        source: Path,
        *,
        owner: int,
        roots: Sequence[str],
        env: Mapping[str, str],
        workdir: str,
        ids: SubIds | None = None,
    ) -> Entry | None:
        """Copy the prepared roots under ``source`` (``source/<root>``) into the entry ``key``
        (call inside ``building``; with ``ids``, as the root of a namespace so mapped, whose files
        keep their owners), then evict down to the bounds (``_place``); None when it is larger than
        the whole budget, or copying failed (the trial goes on from its own preparation)."""
        staging = self.root / f".staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tree = staging / "tree"
        tree.mkdir(parents=True)
        try:
            copied = await _copy_trees(source, tree, roots, ids)
            size = disk_bytes(tree) if copied else 0
            if not copied or size > self.max_bytes:
                _remove_tree(staging)
                return None
            meta = {
                "owner": owner,
                "roots": list(roots),
                "env": dict(env),
                "workdir": workdir,
                "bytes": size,
                "created": time.time(),
            }
            (staging / "meta.json").write_text(json.dumps(meta))
            fd = await acquire(self.root / _USAGE, fcntl.LOCK_EX, _USAGE_TIMEOUT, "the prepared-environment count")
        except BaseException:
            _remove_tree(staging)
            raise
        # The thread owns the lock and the staging directory from here, also if this trial is cancelled.
        if not await asyncio.to_thread(self._place, fd, key, staging, size):
            return None
        return self.lookup(key)

    def _place(self, fd: int, key: str, staging: Path, size: int) -> bool:
        """Under the cache's lock (``fd``, closed here): ``staging`` moved into place as the entry
        ``key``, counted, then the least recently used evicted down to the bounds (``_shrink``);
        False (``staging`` removed) when a complete entry is there already. Blocking."""
        try:
            target = self.root / key
            if (target / "meta.json").exists():  # complete, but not for this trial (another user's)
                _remove_tree(staging)
                return False
            if target.exists():  # an entry without meta.json: left by a crash before the rename's time
                _remove_tree(target)
            usage = _load(fd)
            if usage is not None:  # counted before it is visible: a crash between the two over-counts
                usage.entries, usage.bytes = usage.entries + 1, usage.bytes + size
                _save(fd, usage)
            staging.rename(target)
            self._shrink(fd, usage, key)
            return True
        except BaseException:
            _remove_tree(staging)
            raise
        finally:
            os.close(fd)
            self._remove_stale_staging()

    def _shrink(self, fd: int, usage: _Usage | None, keep: str) -> list[str]:
        """While ``usage`` is over the bounds, evict the least recently used the last full pass
        noted: each is still the least recently used of all unless its ``meta.json``'s mtime
        changed since (used, or published anew), as every other entry was newer then and is newer
        now. A full pass when they run out or nothing is counted yet (or a crash cut the count)."""
        removed: list[str] = []
        kept: list[tuple[str, int, int]] = []  # in use now: evicted once free
        while usage is not None and self._over(usage) and usage.oldest:
            key, used, size = candidate = usage.oldest.pop(0)
            path = self.root / key
            if mtime_ns(path / "meta.json") != used:
                continue
            if key == keep or self._remove(Entry(key, path, 0, (), {}, "/", size)):
                kept.append(candidate)
                continue
            usage.entries, usage.bytes = usage.entries - 1, usage.bytes - size
            removed.append(key)
        if usage is None or self._over(usage):
            return removed + self._full_pass(fd, keep)
        usage.oldest[:0] = kept
        _save(fd, usage)
        return removed

    def _over(self, usage: _Usage) -> bool:
        return usage.entries > self.max_entries or usage.bytes > self.max_bytes

    def entries(self) -> list[Entry]:
        """Every complete entry, least recently used first (each read: O(entries))."""
        return [entry for _, entry in self._by_use()]

    def _by_use(self) -> list[tuple[int, Entry]]:
        """Every complete entry after its last use (its ``meta.json``'s mtime), least recent first."""
        found = []
        with contextlib.suppress(OSError):
            for path in self.root.iterdir():
                if not path.name.startswith(".") and path.is_dir() and (entry := self._read(path.name)) is not None:
                    found.append((mtime_ns(entry.path / "meta.json"), entry))
        return sorted(found, key=lambda pair: pair[0])

    def evict(self, *, keep: str | None = None) -> list[str]:
        """Remove least recently used entries (never ``keep``, never one in use) until within the
        bounds, reading every entry (a full pass: ``publish`` makes one only when the candidates
        the last one noted run out); the keys removed. Blocking, on the cache's lock."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / _USAGE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            return self._full_pass(fd, keep)
        finally:
            os.close(fd)

    def _full_pass(self, fd: int, keep: str | None) -> list[str]:
        """Read every entry, evict the least recently used down to the bounds, count the rest
        afresh and note its least recently used for the next evictions (``_shrink``)."""
        used = self._by_use()
        usage = _Usage(len(used), sum(entry.bytes for _, entry in used), [])
        removed = []
        for when, entry in used:
            if self._over(usage) and entry.key != keep and not self._remove(entry):
                usage.entries, usage.bytes = usage.entries - 1, usage.bytes - entry.bytes
                removed.append(entry.key)
            elif len(usage.oldest) < _CANDIDATES:
                usage.oldest.append((entry.key, when, entry.bytes))
        _save(fd, usage)
        return removed

    def clear(self) -> tuple[int, int]:
        """``termgym gc``: remove every entry not in use and every staging directory left by a
        process that is gone; (entries removed, entries kept because in use)."""
        self._remove_stale_staging()
        removed = kept = 0
        with contextlib.suppress(OSError):
            for path in list(self.root.iterdir()):
                if path.name.startswith(".") or not path.is_dir():
                    continue
                entry = Entry(path.name, path, 0, (), {}, "/", 0)
                if self._remove(entry):
                    kept += 1
                else:
                    removed += 1
        with contextlib.suppress(OSError):
            for lock in self.root.glob("*.lock"):
                if not (self.root / lock.stem).exists():
                    self._unlink_unheld(lock)
        return removed, kept

    @staticmethod
    def _unlink_unheld(lock: Path) -> None:
        """Remove a lock file that nobody holds (a preparation under way holds its key's)."""
        fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lock.unlink(missing_ok=True)  # one that opened it meanwhile sees another inode: ``_locked``
        except BlockingIOError:
            pass
        finally:
            os.close(fd)

    def _remove(self, entry: Entry) -> bool:
        """Remove ``entry`` unless it is in use; True when it stays. In use: locked (being built,
        mounted or copied), or the lower directory of a mount, looked up once the lock is taken
        (a trial that mounted it and let go of its lock before is seen)."""
        fd = os.open(self.root / f"{entry.key}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True  # being built, mounted or copied right now
            if any(lower == str(entry.tree) or lower.startswith(f"{entry.tree}/") for lower in mounted_lower_dirs()):
                return True
            doomed = self.root / f".doomed-{entry.key}-{uuid.uuid4().hex[:6]}"
            with contextlib.suppress(OSError):
                entry.path.rename(doomed)  # gone at once for every reader, removed at leisure
                _remove_tree(doomed)
            return False
        finally:
            os.close(fd)

    def _remove_stale_staging(self) -> None:
        with contextlib.suppress(OSError):
            for path in self.root.glob(".doomed-*"):
                _remove_tree(path)
        remove_stale_staging(self.root)


def _load(fd: int) -> _Usage | None:
    """The count in the cache's ``.usage`` file (``fd``); None when it holds none (new, or cut)."""
    data = b""
    while chunk := os.pread(fd, 1 << 16, len(data)):
        data += chunk
    try:
        raw = json.loads(data)
        oldest = [(str(key), int(used), int(size)) for key, used, size in raw["oldest"]]
        return _Usage(int(raw["entries"]), int(raw["bytes"]), oldest)
    except (ValueError, KeyError, TypeError):
        return None


def _save(fd: int, usage: _Usage) -> None:
    data = json.dumps({"entries": usage.entries, "bytes": usage.bytes, "oldest": usage.oldest}).encode()
    os.ftruncate(fd, 0)  # a crash before the write leaves it empty: unknown, the next publish counts afresh
    os.pwrite(fd, data, 0)


def remove_stale_staging(root: Path) -> None:
    """Remove the ``.staging-<pid>-<hex>`` directories under ``root`` whose process is gone: what
    a killed preparation or copy left half-written (the image store's too)."""
    with contextlib.suppress(OSError):
        for path in root.glob(".staging-*"):
            pid = path.name.split("-")[1]
            if not pid.isdigit() or not _pid_alive(int(pid)):
                _remove_tree(path)


def mounted_lower_dirs(mountinfo: str | None = None) -> set[str]:
    """Every lower directory of an overlay in ``mountinfo``, else mounted in any mount namespace a
    process is in (``namespace.namespace_mountinfos``: this one's, sandboxes' own, keepers')."""
    tables = [mountinfo] if mountinfo is not None else namespace_mountinfos()
    lowers: set[str] = set()
    for line in (line for table in tables for line in table.splitlines()):
        _, sep, tail = line.partition(" - ")
        fields = tail.split()
        if not sep or len(fields) < 3 or fields[0] != "overlay":
            continue
        for option in fields[2].split(","):
            if option.startswith("lowerdir="):
                lowers.update(part.replace("\\040", " ") for part in option[len("lowerdir=") :].split(":"))
    return lowers


async def _copy_trees(source: Path, tree: Path, roots: Sequence[str], ids: SubIds | None = None) -> bool:
    """``cp -a`` each root (owners, modes, links, times); False when one could not be copied."""
    sources = [str(source / root) for root in roots if (source / root).exists()]
    return await _cp(*sources, str(tree), ids=ids) if sources else True


async def _cp(*paths: str, ids: SubIds | None = None) -> bool:
    """``cp -a`` (with ``ids``, as the root of a namespace so mapped); True when it succeeded.
    Cancelled, the copy is killed before the cancellation propagates (nothing writes into a
    staging directory its owner removes)."""
    argv = [host_tool("cp"), "-a", "--reflink=auto", "--", *paths]
    process = await spawn(
        mapped_argv(ids, argv) if ids is not None else argv,
        end_process,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return await process.wait() == 0  # no pipes: waiting cannot hang on a held one
    finally:
        await end_process(process)


async def copy_tree(source: Path, dest: Path) -> bool:
    """``cp -a`` the contents of ``source`` into the existing directory ``dest``; False on failure."""
    return await _cp(f"{source}/.", str(dest))


def _remove_tree(path: Path) -> None:
    """Remove the tree ``path``, best effort; what this user cannot remove of it (a prepared layer's
    directories of its subordinate ids, ``subids``) as the root of a namespace mapping them."""
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path) and (ids := subordinate_ids()) is not None:
        remove_mapped(ids, path)


def disk_bytes(tree: Path) -> int:
    """The disk space the files under ``tree`` take (their blocks), links not followed. Blocking."""
    total = 0
    for path in _walk(tree):
        with contextlib.suppress(OSError):
            total += path.lstat().st_blocks * 512
    return total


def mtime_ns(path: Path) -> int:
    """``path``'s modification time in nanoseconds; 0 when it is not there (the first to evict)."""
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
