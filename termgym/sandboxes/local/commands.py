"""The command lines the embedded backend runs on the host: the keeper that holds a sandbox's
namespaces, the way every command enters them, and the limits both start under.

Pure: argv lists in, argv lists out. Every host program is found by absolute path
(``termgym.sandboxes.tools.host_tool``); what runs inside the sandbox is named by its path there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from termgym.sandboxes.local.host import bwrap_supports
from termgym.sandboxes.tools import host_tool

# Docker's default capability set: what root in a container may do, without mounts, tracing,
# module loading or raw devices. Commands entered into the sandbox keep only these.
COMMAND_CAPABILITIES = tuple(
    "chown dac_override fowner fsetid kill setgid setuid setpcap net_bind_service net_raw sys_chroot mknod"
    " audit_write setfcap".split()
)
SHM_BYTES = 64 << 20
# Joins the cgroups named before "--" (each a cgroup.procs file), then runs the rest: a process is
# in the sandbox's cgroups before it starts, so nothing it forks escapes them.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
# The keeper says "ready" once the sandbox is fully set up; commands enter its namespaces.
KEEPER_COMMAND = ("/bin/sh", "-c", "echo ready; exec /bin/sleep infinity")


def keeper_argv(files_dir: Path, roots: Sequence[str], uid: int | None, *, detached: bool = False) -> list[str]:
    """bubblewrap's command line for a sandbox whose writable roots are ``files_dir/<root>``, run
    as the host ``uid`` (None: this process's user); ``detached`` (a kept sandbox): without
    ``--die-with-parent``. To be run ``within_limits``."""
    userns = ("--disable-userns",) if bwrap_supports("--disable-userns") else ()
    options = [
        ("--unshare-all", "--unshare-user", *userns),
        ("--uid", "0", "--gid", "0", "--hostname", "termgym"),
        ("--new-session",) if detached else ("--die-with-parent", "--new-session"),
        ("--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"),
        ("--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib"),
        ("--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin"),
        ("--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev"),
    ]
    argv = [host_tool("bwrap"), *(arg for group in options for arg in group)]
    if bwrap_supports("--size"):
        argv += ["--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"]
    for name in roots:
        argv += ["--bind", str(files_dir / name), f"/{name}"]
    argv += ["--remount-ro", "/", "--chdir", "/", "--clearenv", "--", *KEEPER_COMMAND]
    if uid is not None:
        argv = [host_tool("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    return argv


def enter_argv(keeper_pid: int, argv: Sequence[str], env: Mapping[str, str], cwd: str) -> list[str]:
    """``argv`` run in the namespaces of the keeper ``keeper_pid`` (all of them, its root and
    working directory too) as the sandbox's root, with ``COMMAND_CAPABILITIES`` only, in ``cwd``,
    with exactly ``env``. To be run ``within_limits``."""
    pairs = [f"{key}={value}" for key, value in env.items()]
    capabilities = ",".join(f"+{name}" for name in COMMAND_CAPABILITIES)
    namespaces = ["-U", "-m", "-p", "-n", "-i", "-u", "-r", "-w"]
    enter = [host_tool("nsenter"), "-t", str(keeper_pid), *namespaces, "--"]
    drop = [host_tool("setpriv"), "--inh-caps=-all", f"--bounding-set=-all,{capabilities}", "--"]
    return [*enter, *drop, "/usr/bin/env", "-i", "-C", cwd, *pairs, *argv]


def within_limits(argv: list[str], procs_files: Sequence[str], file_size_limit: int | None) -> list[str]:
    """``argv`` run in the cgroups whose ``cgroup.procs`` files are ``procs_files`` and under the
    per-file size limit (bytes; None: none), both from its first instruction."""
    if file_size_limit is not None:
        argv = [host_tool("prlimit"), f"--fsize={file_size_limit}", "--", *argv]
    if procs_files:
        argv = [host_tool("sh"), "-c", _JOIN, "sh", *procs_files, "--", *argv]
    return argv
