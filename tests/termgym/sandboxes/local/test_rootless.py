"""The embedded backend when termgym does not run as root, run for real as an unprivileged uid
(``nobody``).

Entering a sandbox: bubblewrap's ``--disable-userns`` puts the keeper one user namespace below the
one that owns its other namespaces, where an unprivileged user holds no capability over them, so a
plain ``nsenter`` of all of them is refused (``ipc``: Operation not permitted) and no command could
run. ``enter_argv`` (termgym without root) goes through the owning user namespace first.

A sandbox over an image: termgym itself runs as ``nobody`` (Debian's ``python3.11`` with this
checkout's virtual environment: the project's interpreter lives under ``/root``), copies and
unpacks an image from an OCI layout, and mounts its root in a user namespace of its own
(``termgym.sandboxes.local.holder``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from termgym.sandboxes.local.commands import RootEntry, enter_argv, keeper_argv, within_limits
from termgym.sandboxes.local.keeper import keeper_of
from tests.termgym.sandboxes.local.tiny_images import tiny_image
from tests.termgym.sandboxes.local.unprivileged import NOBODY, SYSTEM_PYTHON, as_nobody, nobody_home, run_as_nobody

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs the sandbox as another, unprivileged uid")


@pytest.fixture
def keeper() -> Iterator[int]:
    """A keeper of an unprivileged user's sandbox (writable /app and /tmp); its pid."""
    files = Path(tempfile.mkdtemp(prefix="termgym-test-rootless-", dir="/tmp"))
    files.chmod(0o755)
    for root in ("app", "tmp"):
        (files / root).mkdir()
        os.chown(files / root, NOBODY, NOBODY)
    process = subprocess.Popen(
        within_limits(keeper_argv(files, ["app", "tmp"]), (), None, uid=NOBODY),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        yield keeper_of(process.pid)
    finally:
        process.kill()
        process.wait()
        subprocess.run(["rm", "-rf", str(files)], check=False)


def run(argv: list[str], entry: RootEntry | None = None) -> subprocess.CompletedProcess[str]:
    guarded = within_limits(argv, (), None, entry)
    return subprocess.run(as_nobody(guarded), capture_output=True, text=True, timeout=30)


def test_an_unprivileged_user_enters_as_the_sandboxs_root_with_no_extra_descriptor(keeper):
    script = "id -u; echo {owner} {own} {close}; ls /proc/self/fd; echo made > /app/x; cat /app/x"
    entered = run(enter_argv(keeper, ["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"}, "/app"))
    assert entered.returncode == 0, entered.stderr
    uid, braces, *fds, made = entered.stdout.split("\n")[:-1]
    assert uid == "0" and made == "made"
    assert braces == "{owner} {own} {close}"  # the command's own arguments are never rewritten
    assert sorted(map(int, fds)) == [0, 1, 2, 3]  # 3: ls's own, on the directory it lists


def test_the_plain_way_in_is_refused_to_an_unprivileged_user(keeper):
    """What every command of a rootless termgym hit before: the keeper's namespaces, all at once
    (the way in as root, the guard's own)."""
    refused = run(["/bin/true"], RootEntry(keeper, "/", {}))
    assert refused.returncode != 0 and "Operation not permitted" in refused.stderr


# -- a sandbox over an image, termgym itself unprivileged -------------------------------------------

SCRIPT = textwrap.dedent("""\
    import asyncio, json, os, site, sys
    site.addsitedir(sys.argv[1])
    from termgym.sandboxes.base import SandboxSpec
    from termgym.sandboxes.local import LocalSandbox

    async def main():
        spec = SandboxSpec("rootless-image", None, None, image=sys.argv[2], network=sys.argv[4] == "network")
        sandbox = LocalSandbox(spec)
        async with sandbox:
            ran = await sandbox.exec(["/bin/sh", "-c", sys.argv[3]], timeout=20)
            report = {"output": ran.text, "code": ran.exit_code, "image": sandbox.image,
                      "changes": await sandbox.agent_changes(), "warnings": sandbox.warnings,
                      "holder": sandbox._holder.pid if sandbox._holder else None}
        print(json.dumps(report))

    asyncio.run(main())
    """)


def shell_image(root: Path, programs: tuple[str, ...] = ()) -> str:
    """An OCI layout holding one image: dash as /bin/sh, its libraries, ``programs`` and /etc/marker."""
    return tiny_image(root, programs, {"etc/marker": "from-the-image\n"})


@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="Debian's python3.11 runs termgym as nobody")
def test_an_unprivileged_termgym_runs_a_sandbox_over_an_image(tmp_path):
    scratch = Path(tempfile.mkdtemp(prefix="termgym-test-rootless-image-", dir="/tmp"))
    try:
        home = nobody_home(scratch)
        ref = shell_image(scratch)
        command = "read m < /etc/marker; echo $m; echo made > /usr/made; read n < /usr/made; echo $n"
        report = run_as_nobody(SCRIPT, [ref, command, "none"], home)
        assert report["code"] == 0 and report["output"] == "from-the-image\nmade\n", report
        assert report["image"]["source"] == "docker_image" and report["image"]["digest"].startswith("sha256:")
        assert report["changes"] == {"/usr/made": "A"}, report["changes"]
        assert not any("image" in warning for warning in report["warnings"]), report["warnings"]
        holder = report["holder"]
        assert holder is not None and not Path(f"/proc/{holder}").exists()  # ended with the sandbox
        (rootfs,) = (home / "cache" / "images" / "images").glob("*/rootfs")
        assert (rootfs / "etc" / "marker").read_text() == "from-the-image\n" and not (rootfs / "usr" / "made").exists()
        assert {path.lstat().st_uid for path in rootfs.rglob("*")} == {NOBODY}
        assert list((home / "sandboxes").iterdir()) in ([], [home / "sandboxes" / "cache"])
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)


@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="Debian's python3.11 runs termgym as nobody")
@pytest.mark.skipif(shutil.which("pasta") is None, reason="user-mode networking is passt's pasta")
def test_an_unprivileged_termgym_gives_a_sandbox_over_an_image_the_network_it_asks_for(tmp_path):
    """The image has only dash: the interfaces are read from /proc/net/dev with the shell's own
    read. Without network, the sandbox has its loopback alone."""
    scratch = Path(tempfile.mkdtemp(prefix="termgym-test-rootless-net-", dir="/tmp"))
    try:
        home = nobody_home(scratch)
        ref = shell_image(scratch)
        command = "while read name rest; do echo $name; done < /proc/net/dev"
        given = run_as_nobody(SCRIPT, [ref, command, "network"], home)
        withheld = run_as_nobody(SCRIPT, [ref, command, "none"], home)
        assert given["code"] == 0 and given["output"].split()[2:] == ["lo:", "eth0:"], given
        assert not [warning for warning in given["warnings"] if "network" in warning], given["warnings"]
        assert withheld["output"].split()[2:] == ["lo:"], withheld
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)


PREPARED = textwrap.dedent("""\
    import asyncio, json, site, sys
    from pathlib import Path
    site.addsitedir(sys.argv[1])
    from termgym.sandboxes.base import SandboxSpec
    from termgym.sandboxes.local import LocalSandbox

    async def main():
        context, reports = Path(sys.argv[3]), []
        for command in sys.argv[4:]:
            spec = SandboxSpec("rootless-prepared", context, context / "Dockerfile", image_aliases={"base": sys.argv[2]})
            async with LocalSandbox(spec) as sandbox:
                ran = await sandbox.exec(["/bin/sh", "-c", command], timeout=20)
                reports.append({"output": ran.text, "prepared": sandbox.image.get("prepared"),
                                "changes": await sandbox.agent_changes()})
        print(json.dumps(reports))

    asyncio.run(main())
    """)


@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="Debian's python3.11 runs termgym as nobody")
def test_an_unprivileged_termgym_keeps_the_deletions_of_a_prepared_layer_and_of_the_agent(tmp_path):
    """``FROM`` an image, a ``RUN`` that deletes one of its files: the file is gone in the sandbox
    that prepared the layer and in the next, started from the cache (the layer's whiteout made and
    copied without root); an agent's own deletion is listed as one."""
    scratch = Path(tempfile.mkdtemp(prefix="termgym-test-rootless-prepared-", dir="/tmp"))
    try:
        home = nobody_home(scratch)
        ref = shell_image(scratch, ("/usr/bin/rm",))
        context = scratch / "context"
        context.mkdir()
        (context / "Dockerfile").write_text("FROM base\nRUN rm /etc/marker && echo made > /etc/made\n")
        subprocess.run(["chmod", "-R", "a+rX", str(context)], check=True)
        look = "read m 2>/dev/null </etc/marker && echo marker:$m || echo marker:gone; read n < /etc/made; echo $n"
        first, second = run_as_nobody(PREPARED, [ref, str(context), look, f"rm /etc/made; {look}"], home)
        assert first["output"] == "marker:gone\nmade\n" and first["changes"] == {}, first
        assert first["prepared"] is None and second["prepared"] is not None, second  # made, then from the cache
        assert second["output"].startswith("marker:gone\n"), second
        changes = second["changes"]
        assert changes["/etc/made"] == "D" and set(changes) <= {"/etc", "/etc/made"}, changes
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)


# -- the holder, in this process -------------------------------------------------------------------


async def test_a_holder_mounts_the_overlay_in_its_own_namespaces_and_takes_it_along(tmp_path):
    """``start_holder``: the overlay of two lower layers is seen through ``view_path`` and inside
    (``inside_argv``), never in this process's mount table, and ends with the holder."""
    from termgym.sandboxes.host_processes import end_process
    from termgym.sandboxes.local.holder import inside_argv, start_holder, view_path

    base = Path(tempfile.mkdtemp(prefix="termgym-test-holder-", dir="/tmp"))
    try:
        top, bottom, upper, work, view = (base / name for name in ("top", "bottom", "upper", "work", "view"))
        for directory in (top, bottom, upper, work, view):
            directory.mkdir()
        (bottom / "a").write_text("bottom\n")
        (bottom / "b").write_text("bottom\n")
        (top / "a").write_text("top\n")
        holder = await start_holder([top, bottom], upper, work, view)
        try:
            seen = view_path(holder.pid, view)
            assert (seen / "a").read_text() == "top\n" and (seen / "b").read_text() == "bottom\n"
            assert str(view) not in Path("/proc/self/mounts").read_text()  # the host's table never sees it
            ran = subprocess.run(inside_argv(holder.pid, ["cat", str(view / "b")]), capture_output=True, text=True)
            assert ran.returncode == 0 and ran.stdout == "bottom\n", ran.stderr
            (seen / "c").write_text("new\n")
            assert (upper / "c").read_text() == "new\n" and not (bottom / "c").exists()
        finally:
            await end_process(holder)
        assert not Path(f"/proc/{holder.pid}").exists() and list(view.iterdir()) == []
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)


async def test_a_holder_that_cannot_mount_says_why_in_one_line(tmp_path):
    from termgym.errors import SandboxError
    from termgym.sandboxes.local.holder import holder_argv, start_holder

    base = Path(tempfile.mkdtemp(prefix="termgym-test-holder-", dir="/tmp"))
    try:
        with pytest.raises(SandboxError) as missing:
            await start_holder([base / "absent"], base / "upper", base / "work", base / "view")
        assert "\n" not in str(missing.value) and "without root privileges" in str(missing.value)
        with pytest.raises(SandboxError, match="cannot name"):
            await start_holder([base / "a,b"], base / "upper", base / "work", base / "view")
        with pytest.raises(ValueError, match="cannot name"):
            holder_argv([base / "a:b"], base / "upper", base / "work", base / "view")
    finally:
        subprocess.run(["rm", "-rf", str(base)], check=False)
