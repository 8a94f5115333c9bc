"""Running termgym as an unprivileged uid (``nobody``, or ``SUBID_USER``, which has subordinate ids)
from a test that runs as root: Debian's ``python3.11`` with this checkout's virtual environment (the
project's interpreter lives under ``/root``, which ``nobody`` cannot read), in a home of its own that
holds its sandboxes and caches."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3.11"
SITE = Path(sys.prefix) / "lib" / "python3.11" / "site-packages"
CHECKOUT = Path(__file__).resolve().parents[4]
SUBID_USER = "termgym-subids"  # a system user with 65536 subordinate uids and gids, made where missing
SUBIDS = 65536


def as_nobody(argv: list[str], uid: int = NOBODY, gid: int = NOBODY) -> list[str]:
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]


def nobody_home(scratch: Path, uid: int = NOBODY, gid: int = NOBODY) -> Path:
    """``scratch/home``, owned by ``uid`` (``nobody``; ``scratch`` made readable by all)."""
    scratch.chmod(0o755)
    home = scratch / "home"
    home.mkdir()
    os.chown(home, uid, gid)
    return home


def _range(path: str, name: str) -> int | None:
    with open(path) as ids:
        return next((int(f[1]) for f in (line.strip().split(":") for line in ids) if f[0] == name), None)


def subid_user() -> tuple[int, int, int, int] | str:
    """``SUBID_USER``'s (uid, gid, first subordinate uid, first subordinate gid), the user and its
    ranges made where missing, idempotently (as scripts/podman-service.sh makes its user: 65536
    ids after every range already given); or why it cannot be made (then a test skips)."""
    missing = [
        tool for tool in ("useradd", "newuidmap", "newgidmap") if shutil.which(tool, path="/usr/sbin:/usr/bin") is None
    ]
    if os.geteuid() != 0 or missing:
        return f"a user with subordinate ids is made as root with useradd and uidmap's newuidmap (missing: {missing})"
    try:
        pwd.getpwnam(SUBID_USER)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", SUBID_USER])
        if made.returncode != 0:
            return f"useradd {SUBID_USER} failed"
    for path in ("/etc/subuid", "/etc/subgid"):
        Path(path).touch()
        if _range(path, SUBID_USER) is None:
            script = 'BEGIN { n = 100000 } $3 && $2 + $3 > n { n = $2 + $3 } END { print u ":" n ":" c }'
            line = subprocess.run(
                ["awk", "-F:", "-v", f"u={SUBID_USER}", "-v", f"c={SUBIDS}", script, path],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            with open(path, "a") as ids:
                ids.write(line)
    user = pwd.getpwnam(SUBID_USER)
    uid_start, gid_start = _range("/etc/subuid", SUBID_USER), _range("/etc/subgid", SUBID_USER)
    assert uid_start is not None and gid_start is not None
    return user.pw_uid, user.pw_gid, uid_start, gid_start


def nobody_env(home: Path) -> dict[str, str]:
    """The environment of a termgym that keeps its sandboxes and caches in ``home``."""
    env = {"PATH": "/usr/sbin:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home)}
    return env | {"TERMGYM_SANDBOX_DIR": str(home / "sandboxes"), "TERMGYM_ENV_CACHE_DIR": str(home / "cache")}


def run_as_nobody(
    script: str, args: list[str], home: Path, timeout: float = 180, uid: int = NOBODY, gid: int = NOBODY
) -> dict:
    """Run the Python ``script`` as ``nobody`` (or ``uid``) in ``home`` (``sys.argv[1]``: the site
    directory to add; then ``args``); the JSON object its last line of output holds."""
    path = home.parent / "script.py"
    path.write_text(script)
    path.chmod(0o644)
    env = nobody_env(home) | {"PYTHONPATH": str(CHECKOUT)}
    argv = as_nobody([SYSTEM_PYTHON, str(path), str(SITE), *args], uid, gid)
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=home)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return json.loads(ran.stdout.splitlines()[-1])
