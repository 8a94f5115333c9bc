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
import os
import pwd
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from termgym.errors import BackendUnavailable
from termgym.sandboxes.tools import host_tool

REMOVE_TIMEOUT = 300.0


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
def subordinate_ids(count: int) -> SubIds | None:
    """This user's ``count`` subordinate uids and gids (the module's docstring), or None: as root,
    or where it has no such range or cannot map one."""
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
    return SubIds(os.getuid(), os.getgid(), uid_start, gid_start, count)


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
