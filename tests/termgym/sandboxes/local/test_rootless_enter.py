"""Entering a sandbox when termgym does not run as root: bubblewrap's ``--disable-userns`` puts
the keeper one user namespace below the one that owns its other namespaces, where an unprivileged
user holds no capability over them, so a plain ``nsenter`` of all of them is refused (``ipc``:
Operation not permitted) and no command could run. ``enter_argv(privileged=False)`` goes through
the owning user namespace first. Run for real as an unprivileged uid (``nobody``), with the same
keeper and guard termgym uses."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from termgym.sandboxes.host_processes import children
from termgym.sandboxes.local.commands import enter_argv, keeper_argv, within_limits

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs the sandbox as another, unprivileged uid")
NOBODY = 65534


def as_nobody(argv: list[str]) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]


@pytest.fixture
def keeper() -> Iterator[int]:
    """A keeper of an unprivileged user's sandbox (writable /app and /tmp); its pid."""
    files = Path(tempfile.mkdtemp(prefix="termgym-test-rootless-", dir="/tmp"))
    files.chmod(0o755)
    for root in ("app", "tmp"):
        (files / root).mkdir()
        os.chown(files / root, NOBODY, NOBODY)
    process = subprocess.Popen(
        within_limits(keeper_argv(files, ["app", "tmp"], NOBODY), (), None),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        (init,) = children(process.pid)
        (pid,) = children(init)
        yield pid
    finally:
        process.kill()
        process.wait()
        subprocess.run(["rm", "-rf", str(files)], check=False)


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(as_nobody(within_limits(argv, (), None)), capture_output=True, text=True, timeout=30)


def test_an_unprivileged_user_enters_as_the_sandboxs_root_with_no_extra_descriptor(keeper):
    script = "id -u; echo {owner} {own} {close}; ls /proc/self/fd; echo made > /app/x; cat /app/x"
    entered = run(enter_argv(keeper, ["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"}, "/app", privileged=False))
    assert entered.returncode == 0, entered.stderr
    uid, braces, *fds, made = entered.stdout.split("\n")[:-1]
    assert uid == "0" and made == "made"
    assert braces == "{owner} {own} {close}"  # the command's own arguments are never rewritten
    assert sorted(map(int, fds)) == [0, 1, 2, 3]  # 3: ls's own, on the directory it lists


def test_the_plain_way_in_is_refused_to_an_unprivileged_user(keeper):
    """What every command of a rootless termgym hit before: the keeper's namespaces, all at once."""
    refused = run(enter_argv(keeper, ["/bin/true"], {}, "/", privileged=True))
    assert refused.returncode != 0 and "Operation not permitted" in refused.stderr
