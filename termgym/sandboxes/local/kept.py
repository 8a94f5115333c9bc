"""A kept sandbox's state file (``--keep``): what another process needs to enter it again, written
whole or not at all, and read back only while the very processes it names still run.

``kept.json`` sits in the kept sandbox's host directory. It names the keeper's bubblewrap process
and the keeper (each with its start time, against pid reuse), without root over an image the
holder whose namespaces hold its root's mount (``holder``), the sandbox's uid, writable roots,
cgroups, storage, environment and working directory (``LocalSandbox.keep`` writes it,
``leftovers.enter_kept`` reads it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from termgym.errors import SandboxError
from termgym.sandboxes.base import Resources, Sandbox
from termgym.sandboxes.host_processes import end_detached, same_process, start_detached, start_time
from termgym.sandboxes.limits import SandboxCgroup
from termgym.sandboxes.local.commands import ImageRoot
from termgym.sandboxes.local.holder import START_TIMEOUT, holder_argv
from termgym.sandboxes.local.storage import SizedFilesystem
from termgym.sandboxes.local.subids import SubIds

KEPT_STATE = "kept.json"  # in a kept sandbox's host directory: what attach() needs to enter it


def write_json(path: Path, data: dict) -> None:
    """Write ``path`` whole or not at all (a reader never sees half of it)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def detach_holder(
    lowers: Sequence[Path], upper: Path, work: Path, view: Path, ids: SubIds | None, log: Path
) -> tuple[int, int | None]:
    """A holder of the overlay (``holder.holder_argv``, ``detached``) that outlives this process, as
    a kept keeper does (``host_processes.start_detached``): its ``(pid, start time)`` once its mount
    is made; ``SandboxError`` saying why not (its stderr goes to ``log``). Blocking."""
    try:
        pid = start_detached(holder_argv(lowers, upper, work, view, ids, detached=True), log=log, timeout=START_TIMEOUT)
    except ValueError as exc:  # a path an overlay cannot name
        raise SandboxError(str(exc)) from None
    except SandboxError as exc:
        why = str(exc).rpartition(": ")[2]
        raise SandboxError(f"could not mount the kept sandbox's root again, detached: {why}") from None
    return pid, start_time(pid)


def kept_state(
    detached: tuple[int, int | None],
    keeper: int | None,
    *,
    uid: int | None,
    roots: Sequence[str],
    cgroup: SandboxCgroup | None,
    storage: SizedFilesystem | None,
    file_size_limit: int | None,
    view: Path | None,
    sandbox: Sandbox,
    image_root: ImageRoot | None = None,
    holder: tuple[int, int | None] | None = None,
    mapped_ids: bool = False,
    layers: Sequence[Path] | None = (),
) -> dict:
    """The state a kept sandbox's ``kept.json`` holds (JSON-ready): its detached bubblewrap
    ``(pid, start time)``, its keeper's pid and start time, its detached ``holder``'s (without
    root, over an image; ``mapped_ids``: its user namespace maps subordinate ids; ``layers``: what
    it mounts), and what it was started with."""
    return {
        "bwrap": list(detached),
        "holder": list(holder) if holder is not None else None,
        "mapped_ids": mapped_ids,
        "layers": [str(layer) for layer in layers or ()],  # what the holder mounts, top first
        "keeper": keeper,
        "keeper_start": start_time(keeper) if keeper else None,
        "uid": uid,
        "roots": list(roots),
        "cgroup": {c: [v, str(d)] for c, (v, d) in cgroup.dirs.items()} if cgroup else None,
        "storage": None
        if storage is None
        else {"image": storage.image and str(storage.image), "size_mb": storage.size_mb},
        "file_size_limit": file_size_limit,
        "view": view and str(view),
        "image_root": None
        if image_root is None
        else {
            "root": str(image_root.root),
            "kit": str(image_root.kit),
            "kit_at": image_root.kit_at,
            "resolv": image_root.resolv and str(image_root.resolv),
        },
        "env": sandbox.env,
        "workdir": sandbox.workdir,
        "image": sandbox.image,
        "name": sandbox.spec.name,
        "resources": vars(sandbox.spec.resources),
        "labels": dict(sandbox.spec.labels),
    }


def read_kept(directory: Path) -> dict | None:
    """The state of the kept sandbox in ``directory`` while its keeper runs (the same processes
    that were kept, not reused pids); None when there is none, or it is no longer running."""
    try:
        state = json.loads((directory / KEPT_STATE).read_text())
        pid, started = int(state["bwrap"][0]), state["bwrap"][1]
        keeper, keeper_started = int(state["keeper"]), state.get("keeper_start")
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    if not (same_process(pid, started) and same_process(keeper, keeper_started)):
        return None
    holder = kept_holder(state)
    if holder is not None and not same_process(*holder):
        return None
    return state


def kept_holder(state: dict) -> tuple[int, int | None] | None:
    """The detached holder ``(pid, start time)`` a kept sandbox's state names, if any."""
    holder = state.get("holder")
    return (int(holder[0]), holder[1]) if holder else None


def end_kept(path: Path) -> bool:
    """End the keeper of the kept sandbox in ``path`` (if it still runs), then its holder (if it
    still is the process kept.json names, so its root's mount goes with its namespaces), and wait
    until its cgroups are empty, then remove them; True when it was a kept sandbox. Blocking."""
    try:
        state = json.loads((path / KEPT_STATE).read_text())
        pid, started = int(state["bwrap"][0]), state["bwrap"][1]
        holder = kept_holder(state)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return False
    end_detached(pid, started)
    if holder is not None:
        end_detached(*holder)
    if state.get("cgroup"):
        SandboxCgroup({c: (int(v), Path(d)) for c, (v, d) in state["cgroup"].items()}, Resources()).end_all()
    return True
