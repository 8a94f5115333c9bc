"""The root of a sandbox over an image when termgym does not run as root: the overlay is mounted
in a user and mount namespace of the user's own (Linux lets an unprivileged user mount overlayfs
there), held by one long-lived "holder" process, and every keeper of the sandbox (the first, its
spare, one started again after the kill step) is started inside that namespace, so all of them
share the one mount; the host's mount table never sees it.

The holder is ``unshare`` of the host's util-linux, under ``setpriv --pdeathsig KILL``: it ends with
the process that started it (and with it the mount); a kept sandbox's is started detached without it
(``LocalSandbox.keep``) and ended by pid and start time (``kept``). Its files are reached from the
host through ``/proc/<holder>/root`` (``view_path``). With ``ids`` (an image's ``USER``, ``subids``)
its user namespace maps ids 1.. to this user's subordinate ids, and it forbids user namespaces
inside it. Pure parts: ``holder_argv``, ``inside_argv``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from termgym.aio import wait_for
from termgym.errors import SandboxError
from termgym.sandboxes.host_processes import close_output_pipes, end_process, read_stderr, spawn
from termgym.sandboxes.local.subids import SubIds
from termgym.sandboxes.tools import host_tool

START_TIMEOUT = 30.0
_UNSAFE = set(",:\\\n ")  # would break the overlay's option string
_MOUNT_THEN_HOLD = 'mount -t overlay termgym -o "$1" "$2" && echo ready && exec sleep infinity'
_NO_USERNS = "echo 0 > /proc/sys/user/max_user_namespaces && "  # in the namespace itself: none below it


def holder_argv(
    lowers: Sequence[Path], upper: Path, work: Path, view: Path, ids: SubIds | None = None, *, detached: bool = False
) -> list[str]:
    """The holder's command line: a user namespace where this user is root, a private mount
    namespace, the overlay of ``lowers`` (top first) and ``upper`` mounted at ``view`` (with
    ``userxattr``: an unprivileged overlay keeps its whiteouts' marks in ``user.`` attributes),
    then ``ready`` and a wait; with ``ids``, mapped so (``SubIds``), user namespaces forbidden below.
    ``detached`` (a kept sandbox's, ``--keep``): without the death signal, so it outlives termgym.
    ``ValueError`` for a path an overlay cannot name."""
    paths = [str(path) for path in (*lowers, upper, work)]
    if any(_UNSAFE & set(path) for path in paths):
        raise ValueError(f"an overlay cannot name {paths} (a comma, colon, backslash or space)")
    options = f"lowerdir={':'.join(paths[:-2])},upperdir={upper},workdir={work},userxattr"
    users = ids.unshare_options() if ids is not None else ["--user", "--map-root-user"]
    unshare = [host_tool("unshare"), *users, "--mount", "--propagation", "private", "--"]
    script = _MOUNT_THEN_HOLD if ids is None else _MOUNT_THEN_HOLD.replace("&& ", f"&& {_NO_USERNS}", 1)
    dies_with_parent = [] if detached else [host_tool("setpriv"), "--pdeathsig", "KILL", "--"]
    return [
        *dies_with_parent,
        *unshare,
        host_tool("sh"),
        "-c",
        script,
        "sh",
        options,
        str(view),
    ]


def inside_argv(holder_pid: int, argv: Sequence[str]) -> list[str]:
    """``argv`` run in the holder's user and mount namespaces, as this user (root there)."""
    return [host_tool("nsenter"), "--preserve-credentials", "-t", str(holder_pid), "-U", "-m", "--", *argv]


def view_path(holder_pid: int, view: Path) -> Path:
    """Where the host reaches the overlay the holder ``holder_pid`` mounted at ``view``."""
    return Path(f"/proc/{holder_pid}/root") / view.relative_to("/")


async def start_holder(
    lowers: Sequence[Path], upper: Path, work: Path, view: Path, ids: SubIds | None = None
) -> asyncio.subprocess.Process:
    """A holder whose overlay is mounted (``SandboxError`` with its reason when it cannot be)."""
    try:
        argv = holder_argv(lowers, upper, work, view, ids)
    except ValueError as exc:
        raise SandboxError(str(exc)) from None
    process = await spawn(
        argv,
        end_process,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    assert process.stdout is not None
    try:
        line = await wait_for(process.stdout.readline(), START_TIMEOUT)
    except TimeoutError:
        line = b""
    if line != b"ready\n":
        await end_process(process)
        reason = (await read_stderr(process)).strip().splitlines()[-1:] or ["no output"]
        raise SandboxError(f"could not mount the image's root without root privileges: {reason[0][:200]}")
    close_output_pipes(process)  # it says nothing more (it sleeps): two descriptors fewer a live sandbox
    return process
