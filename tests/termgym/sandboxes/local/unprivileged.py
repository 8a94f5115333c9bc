"""Running termgym as an unprivileged uid (``nobody``) from a test that runs as root: Debian's
``python3.11`` with this checkout's virtual environment (the project's interpreter lives under
``/root``, which ``nobody`` cannot read), in a home of its own that holds its sandboxes and caches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3.11"
SITE = Path(sys.prefix) / "lib" / "python3.11" / "site-packages"
CHECKOUT = Path(__file__).resolve().parents[4]


def as_nobody(argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]


def nobody_home(scratch: Path) -> Path:
    """``scratch/home``, owned by ``nobody`` (``scratch`` made readable by all)."""
    scratch.chmod(0o755)
    home = scratch / "home"
    home.mkdir()
    os.chown(home, NOBODY, NOBODY)
    return home


def nobody_env(home: Path) -> dict[str, str]:
    """The environment of a termgym that keeps its sandboxes and caches in ``home``."""
    env = {"PATH": "/usr/sbin:/usr/bin:/bin", "HOME": str(home), "TMPDIR": str(home)}
    return env | {"TERMGYM_SANDBOX_DIR": str(home / "sandboxes"), "TERMGYM_ENV_CACHE_DIR": str(home / "cache")}


def run_as_nobody(script: str, args: list[str], home: Path, timeout: float = 180) -> dict:
    """Run the Python ``script`` as ``nobody`` in ``home`` (``sys.argv[1]``: the site directory to
    add; then ``args``); the JSON object its last line of output holds."""
    path = home.parent / "script.py"
    path.write_text(script)
    path.chmod(0o644)
    env = nobody_env(home) | {"PYTHONPATH": str(CHECKOUT)}
    argv = as_nobody([SYSTEM_PYTHON, str(path), str(SITE), *args])
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=home)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return json.loads(ran.stdout.splitlines()[-1])
