"""The host programs termgym runs, found once, by absolute path, in places no sandbox can write.

A program found on ``PATH`` is a program whoever can write a ``PATH`` directory chose. ``host_tool``
looks only in the system's own directories and, when termgym runs as root, accepts a program only
if it and its directory belong to root and nobody else can write them (a sandbox's root is never
the host's root). Missing or unsafe: ``BackendUnavailable`` with the package to install.
"""

from __future__ import annotations

import functools
import os
import stat
from pathlib import Path

from termgym.errors import BackendUnavailable

TRUSTED_DIRS = ("/usr/bin", "/usr/sbin", "/bin", "/sbin")
PACKAGES = {
    "bwrap": "bubblewrap",
    "nsenter": "util-linux",
    "setpriv": "util-linux",
    "mount": "mount",
    "umount": "mount",
    "mkfs.ext4": "e2fsprogs",
    "unshare": "util-linux",
    "perl": "perl-base",
    "strace": "strace",
    "ldd": "libc-bin",
    "pasta": "passt",
    "nft": "nftables",
    "ip": "iproute2",
    "skopeo": "skopeo",
    "umoci": "umoci",
    "newuidmap": "uidmap",
    "newgidmap": "uidmap",
}


@functools.cache
def host_tool(name: str) -> str:
    """The absolute path of host program ``name`` (see the module docstring)."""
    for directory in TRUSTED_DIRS:
        path = Path(directory, name)
        if path.is_file() and os.access(path, os.X_OK):
            if os.geteuid() == 0 and not _root_only(path):
                raise BackendUnavailable(
                    f"{path} (or its directory) can be written by a user other than root; refusing to run it"
                )
            return str(path)
    package = PACKAGES.get(name, name)
    raise BackendUnavailable(f"the embedded backend needs {name}: apt-get install {package}")


def _root_only(path: Path) -> bool:
    for item in (path.resolve(), path.resolve().parent):
        info = item.stat()
        if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return False
    return True
