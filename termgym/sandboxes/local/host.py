"""The host as the embedded backend sees it: where sandboxes live, which uid is a sandbox's root,
whether this machine can make unprivileged sandboxes, which top-level directories a sandbox
writes, and where the host's system links lead out of the system directories.

Every probe that runs a program finds it by absolute path (``termgym.sandboxes.tools``) and runs
it with ``HOST_ENV``; the probes that cannot change while the process runs are cached.
"""

from __future__ import annotations

import functools
import os
import secrets
import subprocess
import tempfile
from pathlib import Path

from termgym.errors import BackendUnavailable
from termgym.images.dockerfile import CopyStep, EnvironmentPlan, WorkdirStep
from termgym.sandboxes.host_processes import HOST_ENV
from termgym.sandboxes.local.syscall_filter import this_machine
from termgym.sandboxes.tools import host_tool

STATE_DIR_NAME = "termgym-state"
BASE_WRITABLE = ("app", "tmp", "root", "home", "opt", "srv", "mnt", "var", "run", "logs", "tests", "solution")
HOST_READONLY = ("usr", "etc", "bin", "lib", "lib64", "sbin", "proc", "dev", "sys")
SANDBOX_UID_BASE = 2_000_000_000
SANDBOX_UID_COUNT = 65536


def sandbox_root_dir() -> Path:
    """Where sandbox directories live on the host: ``TERMGYM_SANDBOX_DIR``, else
    ``$TMPDIR/termgym-state`` (a name no ``import`` can take for a package, so a script run from
    ``$TMPDIR`` never imports it as ``termgym``)."""
    return Path(os.environ.get("TERMGYM_SANDBOX_DIR") or Path(tempfile.gettempdir()) / STATE_DIR_NAME)


def legacy_root_dirs() -> list[Path]:
    """Where termgym before 0.x kept sandboxes by default (``$TMPDIR/termgym``), when no
    ``TERMGYM_SANDBOX_DIR`` is set: ``termgym gc`` still removes what it left there."""
    if os.environ.get("TERMGYM_SANDBOX_DIR"):
        return []
    legacy = Path(tempfile.gettempdir()) / "termgym"
    return [legacy] if legacy.is_dir() else []


def sandbox_uid() -> int | None:
    """A fresh unprivileged host uid for a sandbox's root when termgym runs as root; None otherwise
    (the sandbox's root is then the user running termgym)."""
    if os.geteuid() != 0:
        return None
    base = int(os.environ.get("TERMGYM_SANDBOX_UID_BASE") or SANDBOX_UID_BASE)
    return base + secrets.randbelow(SANDBOX_UID_COUNT)


def require_tools() -> None:
    """``BackendUnavailable`` (one line, saying what to do) unless bubblewrap, nsenter, setpriv and
    perl (the guard, ``commands``) are here, the seccomp filter knows this machine and a sandbox
    can be made whose root is an unprivileged user."""
    for name in ("bwrap", "nsenter", "setpriv", "timeout", "env", "sh", "perl"):
        host_tool(name)
    this_machine()
    if not host_tool("setpriv").startswith("/usr/"):
        raise BackendUnavailable(f"{host_tool('setpriv')} is outside /usr, which is all of the host a sandbox sees")
    _probe_user_namespaces()


@functools.cache
def require_searchable(root: Path) -> None:
    """The sandbox's unprivileged user opens its directories (bubblewrap binds them as that user):
    every directory down to ``root`` must be searchable by others."""
    for directory in [root, *root.parents]:
        if not directory.stat().st_mode & 0o001:
            raise BackendUnavailable(
                f"{directory} is not searchable by other users, so a sandbox's unprivileged user cannot reach "
                f"{root}; set TERMGYM_SANDBOX_DIR to a directory under /tmp, or chmod o+x {directory}"
            )


@functools.cache
def bwrap_supports(option: str) -> bool:
    result = subprocess.run([host_tool("bwrap"), "--help"], capture_output=True, text=True, env=HOST_ENV)
    return option in result.stdout


@functools.cache
def keeper_is_init() -> bool:
    """Whether a keeper runs as its PID namespace's init (``commands.keeper_argv``): bubblewrap has
    ``--as-pid-1`` and the host's ``env`` ``--ignore-signal`` (coreutils 8.31), by which the keeper
    ignores SIGCHLD, so that the kernel reaps every orphan it adopts. Else bubblewrap's own reaper
    is the init and the keeper its child."""
    if not bwrap_supports("--as-pid-1"):
        return False
    probe = [host_tool("env"), "--ignore-signal=CHLD", host_tool("true")]
    return subprocess.run(probe, capture_output=True, env=HOST_ENV).returncode == 0


@functools.cache
def _probe_user_namespaces() -> None:
    """Once per process: can an unprivileged sandbox be made here?"""
    uid = sandbox_uid()
    argv = [host_tool("bwrap"), "--unshare-user", "--uid", "0", "--gid", "0", "--ro-bind", "/", "/", "--", "/bin/true"]
    if uid is not None:
        argv = [host_tool("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    result = subprocess.run(argv, capture_output=True, text=True, env=HOST_ENV)
    if result.returncode != 0:
        why = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise BackendUnavailable(
            f"the embedded backend runs each sandbox as an unprivileged user, which needs unprivileged user namespaces "
            f"({why}); enable them (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0) "
            "or use --backend docker"
        )


def writable_roots(plan: EnvironmentPlan | None) -> list[str]:
    """Top-level directories that get a private writable host directory: the fixed set plus every
    top-level path the Dockerfile works in or copies to (``/workspace``, ``/srv``...)."""
    roots: list[str] = list(BASE_WRITABLE)
    paths: list[str] = []
    if plan is not None:
        paths.append(plan.workdir)
        for step in plan.steps:
            if isinstance(step, CopyStep):
                paths.append(step.dest or step.workdir)
            elif isinstance(step, WorkdirStep):
                paths.append(step.path)
            else:
                paths.append(step.workdir)
    for path in paths:
        top = path.strip("/").split("/", 1)[0]
        if top and top not in roots and top not in HOST_READONLY:
            roots.append(top)
    return roots


@functools.cache
def host_strace() -> str | None:
    """The host's ``strace`` (``host_tool``: root's, in ``/usr`` or ``/bin``, which every sandbox sees
    read-only), or None where the host has none."""
    try:
        return host_tool("strace")
    except BackendUnavailable:
        return None
