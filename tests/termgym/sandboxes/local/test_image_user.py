"""An image's USER on the embedded backend, as root: the agent's commands run as that user in a user
namespace of many ids (its files are that uid's inside, the sandbox's uid plus it on the host), the
harness's archive calls as the sandbox's root; a user the image lacks is one line; nothing more is
reachable than before (no nested user namespace, no root file). The image is an OCI layout made
here with umoci (tiny_images). Docker's answer on the same task: tests/termgym/test_image_user.py."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from termgym.errors import ConfigError
from termgym.sandboxes.base import Sandbox, SandboxSpec
from termgym.sandboxes.local import LocalSandbox
from termgym.sandboxes.local.commands import RunAs
from termgym.sandboxes.local.users import resolve_user, split_files
from tests.termgym.sandboxes.local.test_rootless import SCRIPT
from tests.termgym.sandboxes.local.tiny_images import tiny_image
from tests.termgym.sandboxes.local.unprivileged import SYSTEM_PYTHON, nobody_home, run_as_nobody

PASSWD = "root:x:0:0:root:/root:/bin/sh\n# a comment\napp:x:1000:1000::/work:/bin/sh\nbig:x:70000:70000::/:/bin/sh\n"
GROUP = "root:x:0:\napp:x:1000:\nextra:x:2000:someone,app\nother:x:3000:someone\nstaff:x:50:\n"
IDS = 'while read k a b; do case $k in Uid:|Gid:) echo "$k $a";; Groups:) echo "$k $a $b";; esac; done < /proc/self/status'


# -- resolution, as runc's GetExecUser (pure) ---------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("app", RunAs(1000, 1000, (2000,))),  # its own group, and those that list it
        ("1000", RunAs(1000, 1000, (2000,))),  # a uid the passwd file has: that entry
        ("app:staff", RunAs(1000, 50, (2000,))),
        ("app:3000", RunAs(1000, 3000, (2000,))),
        ("4242", RunAs(4242, 0, ())),  # a uid it lacks: group 0, no others
        ("4242:4343", RunAs(4242, 4343, ())),
    ],
)
def test_a_user_resolves_as_dockers_runtime_resolves_it(spec, expected):
    assert resolve_user(spec, PASSWD, GROUP) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("ghost", "unable to find user ghost: no matching entries in passwd file"),
        ("app:ghosts", "unable to find group ghosts: no matching entries in group file"),
        ("big", "unable to find user big: no matching entries in passwd file"),  # past the mapped ids
        ("70000", "user 70000 is uid 70000, gid 0: the embedded backend maps ids below 65536 only"),
    ],
)
def test_a_user_that_cannot_be_resolved_is_one_line(spec, message):
    with pytest.raises(ConfigError) as raised:
        resolve_user(spec, PASSWD, GROUP)
    assert str(raised.value) == message


def test_the_two_files_are_read_apart():
    assert split_files("== /etc/passwd\na\nb\n== /etc/group\nc\n") == ("a\nb", "c")
    assert split_files("== /etc/passwd\n== /etc/group\n") == ("", "")


# -- in a sandbox, as root ------------------------------------------------------------------------

pytestmark = [
    pytest.mark.skipif(shutil.which("umoci") is None, reason="umoci makes the image"),
]
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="a user namespace of many ids needs root")


def user_image(scratch: Path, user: str | None = None) -> str:
    """An image with dash, chown, chmod and touch, the users above and ``/work``, ``/tmp``; its
    config's user ``user``."""
    files = {"etc/passwd": PASSWD, "etc/group": GROUP, "work/.keep": "", "tmp/.keep": ""}
    ref = tiny_image(scratch, ("/usr/bin/chown", "/usr/bin/chmod", "/usr/bin/touch", "/usr/bin/sleep"), files)
    if user is not None:
        subprocess.run(["umoci", "config", "--image", ref.removeprefix("oci:"), "--config.user", user], check=True)
        subprocess.run(["chmod", "-R", "a+rX", str(scratch / "layout")], check=True)  # umoci wrote it anew
    return ref


def dockerfile_task(scratch: Path, ref: str, text: str) -> SandboxSpec:
    context = scratch / "context"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {ref}\n{text}")
    return SandboxSpec("user", context, context / "Dockerfile")


async def sh(sandbox: Sandbox, script: str) -> tuple[int | None, str]:
    result = await sandbox.exec(["/bin/sh", "-c", script], timeout=20)
    return result.exit_code, result.text


@as_root
async def test_the_agent_runs_as_the_images_user_and_the_harness_as_root(scratch, no_leaks):
    spec = dockerfile_task(scratch, user_image(scratch), "RUN chown 1000:1000 /work && chmod 1777 /tmp\nUSER app\n")
    for start in (1, 2):  # the second from the prepared layer, whose /work is 1000's too
        async with LocalSandbox(spec) as sandbox:
            assert isinstance(sandbox, LocalSandbox)
            assert await sh(sandbox, IDS) == (0, "Uid: 1000\nGid: 1000\nGroups: 2000 \n")
            assert await sh(sandbox, "touch /work/made /tmp/made") == (0, "")
            host = sandbox.files_dir  # the root as the host reaches it: 1000 inside is the sandbox's uid + 1000
            for made in (host / "work" / "made", host / "tmp" / "made"):
                assert (made.stat().st_uid, made.stat().st_gid) == (sandbox.owner + 1000, sandbox.owner + 1000)
            assert await sh(sandbox, "touch /etc/x 2>&1") == (1, "touch: cannot touch '/etc/x': Permission denied\n")
            assert "prepared" in sandbox.image or start == 1
            assert not [w for w in sandbox.warnings if "USER" in w], sandbox.warnings


@as_root
async def test_the_image_configs_user_is_inherited_and_a_missing_one_is_one_line(scratch, no_leaks):
    async with LocalSandbox(SandboxSpec("user", None, None, image=user_image(scratch, "app:staff"))) as sandbox:
        assert await sh(sandbox, IDS) == (0, "Uid: 1000\nGid: 50\nGroups: 2000 \n")
    second = scratch / "second"
    second.mkdir()
    spec = dockerfile_task(second, user_image(second, "app"), "USER ghost\n")
    with pytest.raises(ConfigError, match="unable to find user ghost: no matching entries in passwd file"):
        async with LocalSandbox(spec):
            pass


@as_root
async def test_over_the_hosts_system_the_harness_stays_root_and_no_user_namespace_is_made(scratch, no_leaks):
    spec = dockerfile_task(scratch, "termgym/base:bookworm", "USER nobody\n")
    async with LocalSandbox(spec) as sandbox:
        assert isinstance(sandbox, LocalSandbox)
        assert await sh(sandbox, "id -u; id -g") == (0, "65534\n65534\n")
        assert await sh(sandbox, "unshare -U true 2>&1") == (1, "unshare: unshare failed: No space left on device\n")
        assert await sh(sandbox, "touch /opt/x 2>&1") == (1, "touch: cannot touch '/opt/x': Permission denied\n")
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo("secret")
            info.mode, info.size = 0o600, 2
            archive.addfile(info, io.BytesIO(b"ok"))
        await sandbox.upload_tar(buffer.getvalue(), "/opt/harness")  # where the user cannot write
        assert await sh(sandbox, "cat /opt/harness/secret 2>&1") == (1, "cat: /opt/harness/secret: Permission denied\n")
        archive = await sandbox.download_tar(["/opt/harness/secret"], limit=1 << 20)  # read as root
        with tarfile.open(fileobj=io.BytesIO(archive)) as read:
            member = read.extractfile("opt/harness/secret")
            assert member is not None and member.read() == b"ok"
        await sandbox.kill_agent_processes()
        assert sandbox.host_files() is None  # the harness's steps run as the USER, as on Docker


ATTEMPTS = {  # what a USER agent tries, and how each attempt ends
    "cat /proc/1/environ": "Permission denied",  # the keeper's (root's) environment
    "ls /proc/1/root/": "Permission denied",  # and its root
    "unshare -r true": "No space left on device",  # a user namespace of its own, root in it
    "nsenter -t 1 -U true": "Permission denied",  # the keeper's user namespace, as its root
    "echo 9 > /proc/sys/user/max_user_namespaces": "Read-only file system",
    "setpriv --reuid 0 true": "Operation not permitted",
}


@as_root
async def test_a_user_agent_reaches_neither_root_nor_the_keeper(scratch, no_leaks):
    spec = dockerfile_task(scratch, "termgym/base:bookworm", "USER nobody\n")
    async with LocalSandbox(spec) as sandbox:
        for attempt, refusal in ATTEMPTS.items():
            code, text = await sh(sandbox, f"{attempt} 2>&1")
            assert code != 0 and refusal in text, (attempt, code, text)
        # the keeper (the PID namespace's init) holds no capability, not even in its bounding set
        keeper = 'while read k v; do case $k in CapPrm:|CapBnd:) echo "$k $v";; esac; done < /proc/1/status'
        assert await sh(sandbox, keeper) == (0, "CapPrm: 0000000000000000\nCapBnd: 0000000000000000\n")


@as_root
async def test_a_user_agents_detached_writer_does_not_outlive_the_kill_step(scratch, no_leaks):
    """A USER agent's process that leaves its session and keeps writing (a forger waiting for the
    verifier, which runs as the same user) is ended by the kill step like a root agent's."""
    spec = dockerfile_task(scratch, "termgym/base:bookworm", "USER nobody\n")
    beat = "while :; do date +%s%N > /tmp/beat; sleep 0.02; done"
    async with LocalSandbox(spec) as sandbox:
        assert isinstance(sandbox, LocalSandbox)
        # the writer's first beat, however loaded the machine (a read between ">" and date's write is empty)
        wait = 'for _ in $(seq 50); do read b 2>/dev/null </tmp/beat && [ -n "$b" ] && break; sleep 0.1; done; echo $b'
        code, first = await sh(sandbox, f"setsid sh -c '{beat}' </dev/null >/dev/null 2>&1 & {wait}")
        assert code == 0 and first.strip().isdigit(), first
        await sandbox.kill_agent_processes()
        _, before = await sh(sandbox, "cat /tmp/beat")  # empty where the kill fell between the two
        _, after = await sh(sandbox, "sleep 0.3; cat /tmp/beat")
        assert after == before and await sh(sandbox, "id -u") == (0, "65534\n"), (before, after)


@as_root
@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="Debian's python3.11 runs termgym as nobody")
def test_without_root_the_users_is_a_warning_and_commands_run_as_the_sandboxs_root(scratch):
    home = nobody_home(scratch)
    report = run_as_nobody(SCRIPT, [user_image(scratch, "app"), IDS, "none"], home)
    assert report["code"] == 0 and report["output"].startswith("Uid: 0\nGid: 0\n"), report
    warning = "USER app ignored: without root the embedded backend runs every command as root"
    assert f"{warning} (this user has no 65535 subordinate ids it can map)" in report["warnings"], report["warnings"]
