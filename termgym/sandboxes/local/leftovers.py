"""What outlives a trial on the embedded backend, and the registry's hooks that deal with it:
``termgym gc`` (``remove_leftovers``: what killed runs left, kept sandboxes, unused prepared
environments, in today's state directory and in the one older versions used) and ``termgym shell
--attach`` (``attach``: enter a kept sandbox again)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Collection
from pathlib import Path

from termgym.errors import ConfigError, SandboxError
from termgym.sandboxes.base import Resources, SandboxSpec
from termgym.sandboxes.host_processes import alive
from termgym.sandboxes.limits import SandboxCgroup, remove_stale
from termgym.sandboxes.local.commands import ImageRoot
from termgym.sandboxes.local.env_cache import EnvCache, cache_root
from termgym.sandboxes.local.home import claim_home, hold_home, release_home, remove_sandbox_dir
from termgym.sandboxes.local.host import legacy_root_dirs, require_tools, sandbox_root_dir
from termgym.sandboxes.local.images import ImageStore, image_store_root
from termgym.sandboxes.local.keeper import Keeper
from termgym.sandboxes.local.kept import KEPT_STATE, end_kept, kept_holder, read_kept
from termgym.sandboxes.local.namespace import MountNamespace
from termgym.sandboxes.local.sandbox import LocalSandbox
from termgym.sandboxes.local.storage import SizedFilesystem, unmount_sync
from termgym.sandboxes.local.subids import subordinate_ids


def collect_garbage(root: Path | None = None) -> int:
    """Remove sandbox directories whose keeper is gone (left by a run that was killed) and kept
    sandboxes (``--keep``: their keeper is ended), with their file systems and cgroups; a sandbox
    of a live process that is not kept stays, whatever its state (starting, idle with no keeper)
    and wherever its directory. Returns how many were removed."""
    return len(collect_sandboxes(root))


def collect_sandboxes(root: Path | None = None) -> list[tuple[str, bool]]:
    """``collect_garbage``, saying what went: (directory name, whether it was a kept sandbox).
    Without ``root``: today's state directory and the one older versions used.

    A live process's sandbox stays: that process locks its directory (``home.hold_home``) from
    before its labels and cgroups exist until after they are gone, and gc removes one only under
    its own exclusive lock (``claim_home``). A cgroup whose directory is under none of the roots
    scanned goes only when it is empty and no live process holds a directory of its name open
    (``held_directories``)."""
    removed: list[tuple[str, bool]] = []
    live: set[str] = set()
    roots = [root] if root is not None else [sandbox_root_dir(), *legacy_root_dirs()]
    for path in sorted(path for directory in roots for path in directory.glob("tg-*")):
        if not (path / "labels.json").exists():
            continue  # not a sandbox, or one being made (locked before its labels are written)
        if end_kept(path):
            unmount_sync(path / "root")
            unmount_sync(path / "fs")
            remove_sandbox_dir(path)
            removed.append((path.name, True))
            continue
        claim = claim_home(path)
        if claim is None or _older_keeper_runs(path):
            live.add(f"termgym-{path.name}")
            if claim is not None:
                os.close(claim)
            continue
        try:
            if cgroup := SandboxCgroup.find(f"termgym-{path.name}"):
                cgroup.end_all()  # a keeper that outlived its killed run (seen: the spare) may hold the mounts below
            unmount_sync(path / "root")  # an overlay over a prepared environment, on the storage below
            unmount_sync(path / "fs")
            remove_sandbox_dir(path)
        finally:
            os.close(claim)
        removed.append((path.name, False))
    remove_stale("termgym-tg-", keep=live, held=held_cgroups)
    return removed


def _older_keeper_runs(path: Path) -> bool:
    """Whether the ``keeper.pid`` of the sandbox in ``path`` names a running bubblewrap (a live
    sandbox of a version that locked no directory has one while its keeper runs)."""
    try:
        pid = int((path / "keeper.pid").read_text())
        return alive(pid) and Path(f"/proc/{pid}/comm").read_text().strip() == "bwrap"
    except (OSError, ValueError):
        return False


def held_cgroups(names: Collection[str]) -> set[str]:
    """Which of the sandbox cgroup ``names`` (``termgym-tg-...``) may belong to a live sandbox: those
    whose directory (``tg-...``, wherever it is) a process on this host holds open. The process
    that made a sandbox holds its directory open from before its cgroups are made until after
    they are removed (``home.hold_home``), so a cgroup not named here has no live owner. Reads
    every process's descriptors that this process may read (a cgroup this process may remove is
    one its own user made). Blocking."""
    wanted = {name.removeprefix("termgym-"): name for name in names}
    found: set[str] = set()
    if not wanted:
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{entry.name}/fd/{fd}")
            except OSError:
                continue
            directory = target.removesuffix(" (deleted)").rpartition("/")[2]
            if directory in wanted:
                found.add(wanted[directory])
    return found


# -- the backend registry's hooks (termgym.sandboxes) ----------------------------------------------


def preflight() -> None:
    """``BackendUnavailable`` unless this machine can make embedded sandboxes (``require_tools``);
    ``ConfigError`` for a warm pool size that is not a count (``TERMGYM_LOCAL_POOL``)."""
    from termgym.sandboxes.local import pool

    require_tools()
    pool.settings()


async def remove_leftovers(images: bool = False) -> str:
    """``termgym gc``: remove what killed runs left and every kept sandbox (``collect_sandboxes``);
    one line saying how much, naming the kept ones; then the prepared environments no sandbox
    uses (``EnvCache.clear``), an older version's too; with ``images``, the unpacked images no
    sandbox uses (``ImageStore.clear``)."""
    removed = await asyncio.to_thread(collect_sandboxes)
    kept = [name for name, was_kept in removed if was_kept]
    named = f" ({len(kept)} kept: {', '.join(kept)})" if kept else ""
    cleared, in_use = await asyncio.to_thread(EnvCache.from_environment().clear)
    for legacy in legacy_root_dirs():
        if legacy / "cache" != cache_root():
            legacy_cache = EnvCache(legacy / "cache" / "envs", max_bytes=0, max_entries=0)
            more, busy = await asyncio.to_thread(legacy_cache.clear)
            cleared, in_use = cleared + more, in_use + busy
    busy = f", {in_use} in use kept" if in_use else ""
    line = f"removed {len(removed)} leftover local sandbox(es){named} and {cleared} prepared environment(s){busy}"
    if images:
        gone, used = await asyncio.to_thread(ImageStore(image_store_root()).clear)
        line += f"; {gone} unpacked image(s)" + (f", {used} in use kept" if used else "")
    return line


async def attach(sandbox_id: str) -> LocalSandbox:
    """The kept sandbox ``sandbox_id`` (a directory under ``sandbox_root_dir()``), started: its
    commands enter the kept keeper's namespaces; ``stop`` removes it. ``ConfigError`` in one line
    when there is no such kept sandbox running."""
    missing = ConfigError(f"no kept sandbox {sandbox_id} (termgym gc removed it, or it was never kept)")
    if not sandbox_id.startswith("tg-") or "/" in sandbox_id or sandbox_id in (".", ".."):
        raise missing
    directory = sandbox_root_dir() / sandbox_id
    state = await asyncio.to_thread(read_kept, directory)
    # held by this process as by the one that made it: should it stop being kept here (a kill
    # step ends its detached keeper), gc leaves it to this process
    if state is None or not await asyncio.to_thread(_hold, directory):
        raise missing
    try:
        return enter_kept(directory, state)
    except (KeyError, TypeError, ValueError) as exc:
        release_home(directory)
        raise ConfigError(f"kept sandbox {sandbox_id}: its {KEPT_STATE} is unreadable ({exc})") from exc
    except BaseException:
        release_home(directory)
        raise


def _hold(directory: Path) -> bool:
    """``hold_home``; False when the directory is gone or gc is removing it."""
    try:
        return hold_home(directory)
    except OSError:
        return False


def enter_kept(directory: Path, state: dict) -> LocalSandbox:
    """A started sandbox entering the kept one in ``directory`` (``state``: its ``kept.json``)."""
    spec = SandboxSpec(
        name=state["name"],
        context_dir=None,
        dockerfile=None,
        resources=Resources(**state["resources"]),
        labels=state.get("labels") or {},
    )
    sandbox = LocalSandbox(spec)
    sandbox._dir = directory
    sandbox._roots = list(state["roots"])
    sandbox._uid = state["uid"]
    sandbox._keeper = Keeper(sandbox._keeper_argv, directory / "keeper.pid")
    sandbox._keeper.attach((int(state["bwrap"][0]), state["bwrap"][1]), int(state["keeper"]))
    if state.get("cgroup"):
        dirs = {c: (int(v), Path(d)) for c, (v, d) in state["cgroup"].items()}
        sandbox._cgroup = SandboxCgroup(dirs, spec.resources)
    try:
        # without root its mounts are its holder's, which this process enters by nsenter alone
        sandbox._mounts = None if state.get("holder") else MountNamespace.join(directory, int(state["bwrap"][0]))
    except OSError as exc:
        raise SandboxError(f"could not enter the kept sandbox's mount namespace: {exc}") from exc
    if state.get("storage"):
        image = state["storage"]["image"]
        size_mb = state["storage"]["size_mb"]
        sandbox._storage = SizedFilesystem(image and Path(image), directory / "fs", size_mb, sandbox._mounts)
    sandbox._file_size_limit = state.get("file_size_limit")
    sandbox._view = Path(state["view"]) if state.get("view") else None
    if state.get("image_root"):
        root = state["image_root"]
        resolv = Path(root["resolv"]) if root.get("resolv") else None
        sandbox._kept_holder = kept_holder(state)  # stop() ends it
        holder_pid = sandbox._kept_holder[0] if sandbox._kept_holder else None
        sandbox._image_root = ImageRoot(Path(root["root"]), Path(root["kit"]), root["kit_at"], resolv, holder_pid)
        sandbox._ids = subordinate_ids() if state.get("mapped_ids") else None
        sandbox._kept_layers = [Path(layer) for layer in state.get("layers") or ()]
    sandbox.env = dict(state["env"])
    sandbox.workdir = state["workdir"]
    sandbox.image = dict(state.get("image") or {})
    return sandbox


async def close_shared() -> None:
    """Stop the warm pool's idle sandboxes (``termgym.sandboxes.local.pool``), when it is on."""
    from termgym.sandboxes.local import pool

    await pool.close()
