"""This user's subordinate ids (``/etc/subuid``, ``/etc/subgid``), by which an image's ``USER`` is
honoured where termgym does not run as root: the holder's user namespace (``holder``) maps the
sandbox's root to this user and ids 1 to ``count`` to the first ``count`` ids of its range, written by
the set-user-id ``newuidmap`` and ``newgidmap`` (Debian's ``uidmap``) that util-linux's ``unshare``
runs. termgym's own process runs them, never a sandbox's (the guard's ``no_new_privs`` would refuse).

Without such a range, without those programs, or under ``no_new_privs`` itself there are none
(``subordinate_ids`` is None) and the ``USER`` stays a warning. Trees holding files of the range
(an upper layer the image's user wrote, a prepared layer copied from one) are copied and removed as
the root of such a namespace (``mapped_argv``, ``remove_mapped``). Pure: ``find_range``.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from termgym.errors import BackendUnavailable
from termgym.sandboxes.local import host_files, host_trees
from termgym.sandboxes.tools import host_tool

MAPPED_IDS = 65535  # ids 1.. of a sandbox's user namespace mapped to a range (``users.USERS`` less its root)
REMOVE_TIMEOUT = 300.0
MANIFEST_TIMEOUT = 120.0
# ``host_files``' manifest or ``overlay_changes`` (of the manifest on its stdin) in a process of its
# own, host_files and host_trees loaded from their files alone (the standard library below them;
# termgym's package would take 0.5 s to import).
_HOST_FILES = r"""
import importlib.util, json, sys
from pathlib import Path
def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
trees, files, operation, *args = sys.argv[1:]
load("termgym.sandboxes.local.host_trees", trees)
host_files = load("termgym.sandboxes.local.host_files", files)
if operation == "manifest":
    root, owner, limit, *roots = args
    found = host_files.LocalHostFiles(root, int(owner)).manifest(roots, max_entries=int(limit))
else:
    upper = {path: tuple(entry) for path, entry in json.load(sys.stdin).items()}
    found = host_files.overlay_changes(upper, [Path(lower) for lower in args])
json.dump(found, sys.stdout)
"""


@dataclass(frozen=True)
class SubIds:
    """Ids 1 to ``count`` of a user namespace mapped to ``uid_start``.. and ``gid_start``.. on the host,
    its root to this user (``uid``, ``gid``)."""

    uid: int
    gid: int
    uid_start: int
    gid_start: int
    count: int

    def unshare_options(self) -> list[str]:
        """``unshare``'s options for a user namespace so mapped (util-linux 2.38: outer,inner,count)."""
        users, groups = f"{self.uid_start},1,{self.count}", f"{self.gid_start},1,{self.count}"
        return ["--user", "--map-root-user", f"--map-users={users}", f"--map-groups={groups}"]

    def host_uid(self, uid: int) -> int:
        """The host uid of the namespace's ``uid``."""
        return self.uid if uid == 0 else self.uid_start + uid - 1

    def host_gid(self, gid: int) -> int:
        return self.gid if gid == 0 else self.gid_start + gid - 1

    @property
    def key(self) -> str:
        """What tells two mappings apart (a prepared layer's files are the host ids of one)."""
        return f"{self.uid_start}:{self.gid_start}:{self.count}"


def find_range(text: str, names: Sequence[str], count: int) -> int | None:
    """The first id of the first range of ``text`` (``/etc/subuid``'s format: ``name:start:count``)
    given to one of ``names`` (a user's name, its id) that holds ``count`` ids; None if none does."""
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) != 3 or parts[0] not in names or not (parts[1].isdigit() and parts[2].isdigit()):
            continue
        if int(parts[2]) >= count:
            return int(parts[1])
    return None


def _no_new_privs() -> bool:
    """Whether this process runs with ``no_new_privs`` (then ``newuidmap`` would gain nothing)."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return True
    return any(line.split() == ["NoNewPrivs:", "1"] for line in status.splitlines())


@functools.cache
def subordinate_ids(count: int = MAPPED_IDS) -> SubIds | None:
    """This user's ``count`` subordinate uids and gids (the module's docstring), or None: as root,
    or where it has no such range or cannot map one (tried once: a namespace so mapped runs ``true``)."""
    if os.geteuid() == 0 or _no_new_privs():
        return None
    try:
        for tool in ("newuidmap", "newgidmap", "unshare"):
            host_tool(tool)
        name = pwd.getpwuid(os.getuid()).pw_name
        files = Path("/etc/subuid").read_text(), Path("/etc/subgid").read_text()
    except (BackendUnavailable, KeyError, OSError):
        return None
    names = (name, str(os.getuid()))
    uid_start, gid_start = (find_range(text, names, count) for text in files)
    if uid_start is None or gid_start is None:
        return None
    ids = SubIds(os.getuid(), os.getgid(), uid_start, gid_start, count)
    try:  # newuidmap may still refuse it (a range its own configuration does not grant, a kernel's limits)
        tried = subprocess.run(mapped_argv(ids, [host_tool("true")]), capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError, BackendUnavailable):
        return None
    return ids if tried.returncode == 0 else None


def mapped_argv(ids: SubIds, argv: Sequence[str]) -> list[str]:
    """``argv`` run as the root of a new user namespace mapped as ``ids`` (it reaches the files of
    this user and of its range as their owner would, nothing else)."""
    return [host_tool("unshare"), *ids.unshare_options(), "--", *argv]


def remove_mapped(ids: SubIds, path: Path) -> bool:
    """Remove the tree ``path`` as the root of a namespace mapped as ``ids`` (``rm`` never follows a
    link, nor leaves the file system); True when it is gone. Blocking; never raises ``OSError``."""
    if not os.path.lexists(path):
        return True
    argv = mapped_argv(ids, [host_tool("rm"), "-rf", "--one-file-system", "--", str(path)])
    try:
        subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=REMOVE_TIMEOUT, check=False)
    except (OSError, subprocess.SubprocessError):
        pass
    return not os.path.lexists(path)


def _host_files(ids: SubIds, operation: str, args: Sequence[str], what: Path, stdin: bytes = b"") -> dict:
    """``_HOST_FILES``' answer, run as the root of a namespace mapped as ``ids``; ``OSError`` with
    its reason where it fails (about ``what``). Blocking."""
    argv = [sys.executable, "-I", "-S", "-c", _HOST_FILES, str(host_trees.__file__), str(host_files.__file__)]
    argv = mapped_argv(ids, [*argv, operation, *args])
    try:
        ran = subprocess.run(argv, input=stdin, capture_output=True, timeout=MANIFEST_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise OSError(f"reading {what} took over {MANIFEST_TIMEOUT:g}s") from exc
    if ran.returncode != 0:
        reason = ran.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
        raise OSError(f"could not read {what}: {reason[0][:200]}")
    return json.loads(ran.stdout)


def mapped_manifest(
    ids: SubIds, root: Path, owner: int, roots: Sequence[str], max_entries: int
) -> dict[str, tuple[int, ...]]:
    """``LocalHostFiles(root, owner).manifest(roots)`` read as the root of a namespace mapped as
    ``ids``: a directory of the range that its owner made 0700 is listed too. ``OSError`` with the
    reason where it cannot be read (past ``max_entries``, as the manifest). Blocking."""
    found = _host_files(ids, "manifest", [str(root), str(owner), str(max_entries), *roots], root)
    return {path: tuple(entry) for path, entry in found.items()}


def mapped_overlay_changes(ids: SubIds, upper: dict[str, tuple[int, ...]], lowers: Sequence[Path]) -> dict[str, str]:
    """``host_files.overlay_changes(upper, lowers)`` looked up as the root of a namespace mapped as
    ``ids`` (a prepared lower layer may hold directories of the range only their owner enters)."""
    return _host_files(ids, "changes", [str(lower) for lower in lowers], lowers[0], json.dumps(upper).encode())
