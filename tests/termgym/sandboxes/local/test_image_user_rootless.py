"""An image's USER on the embedded backend when termgym does not run as root, run for real as a
user with subordinate ids (``SUBID_USER``, made here): the holder's user namespace maps the
sandbox's root to that user and ids 1..65535 to its range, so the agent runs as the image's user as
on the root path (tests/termgym/sandboxes/local/test_image_user.py), its files that range's ids on
the host; what a USER agent tries is refused as there. Without a range it stays a warning
(test_image_user.py's test as ``nobody``). Pure parts: ``subids.find_range`` and the holder's line."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from termgym.sandboxes.local.holder import holder_argv
from termgym.sandboxes.local.subids import MAPPED_IDS, SubIds, find_range
from termgym.sandboxes.local.users import USERS
from tests.termgym.sandboxes.local.test_image_user import ATTEMPTS, GROUP, IDS, PASSWD
from tests.termgym.sandboxes.local.tiny_images import tiny_image
from tests.termgym.sandboxes.local.unprivileged import SYSTEM_PYTHON, nobody_home, run_as_nobody, subid_user

# -- pure -------------------------------------------------------------------------------------------


def test_a_range_is_found_by_name_or_uid_and_must_hold_the_ids():
    text = "other:100000:65536\n# no\nme:200000:1000\nme:300000:65536\n1234:400000:70000\n"
    assert find_range(text, ("me", "999"), MAPPED_IDS) == 300000  # the first that holds them
    assert find_range(text, ("someone", "1234"), MAPPED_IDS) == 400000
    assert find_range(text, ("me",), 70000) is None and find_range("", ("me",), 1) is None
    assert USERS == MAPPED_IDS + 1


def test_the_holder_of_a_user_namespace_of_many_ids_maps_them_and_forbids_user_namespaces():
    ids = SubIds(1000, 1001, 200000, 300000, MAPPED_IDS)
    argv = holder_argv([Path("/l")], Path("/u"), Path("/w"), Path("/v"), ids)
    assert ["--user", "--map-root-user", "--map-users=200000,1,65535", "--map-groups=300000,1,65535"] == argv[5:9]
    assert "echo 0 > /proc/sys/user/max_user_namespaces && echo ready" in argv[argv.index("-c") + 1]
    assert (ids.host_uid(0), ids.host_uid(1000), ids.host_gid(0), ids.host_gid(2000)) == (1000, 200999, 1001, 301999)
    plain = holder_argv([Path("/l")], Path("/u"), Path("/w"), Path("/v"))
    assert "max_user_namespaces" not in " ".join(plain) and not [arg for arg in plain if arg.startswith("--map-u")]


# -- for real, as a user with subordinate ids ------------------------------------------------------

MADE = subid_user()
PROGRAMS = tuple(
    f"/usr/bin/{name}"
    for name in "chown chmod touch mkdir sleep tar head base64 unshare nsenter setpriv setsid cat ls".split()
)
KEEPER = 'while read k v; do case $k in CapPrm:|CapBnd:) echo "$k $v";; esac; done < /proc/1/status'
SCRIPT = textwrap.dedent("""\
    import asyncio, io, json, os, site, sys, tarfile
    from pathlib import Path
    site.addsitedir(sys.argv[1])
    from termgym.sandboxes.base import Command, SandboxSpec
    from termgym.sandboxes.local import LocalSandbox

    context, checks = Path(sys.argv[2]), json.loads(sys.argv[3])

    async def sh(sandbox, script):
        result = await sandbox.exec(["/bin/sh", "-c", script], timeout=20)
        return [result.exit_code, result.text]

    def archive():
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as made:
            info = tarfile.TarInfo("secret")
            info.mode, info.size = 0o600, 2
            made.addfile(info, io.BytesIO(b"ok"))
        return buffer.getvalue()

    async def main():
        reports = []
        for _ in range(2):  # the second from the prepared layer
            async with LocalSandbox(SandboxSpec("rootless-user", context, context / "Dockerfile")) as sandbox:
                report = {"prepared": sandbox.image.get("prepared"), "warnings": sandbox.warnings,
                          "dir": str(sandbox.host_dir), "ids": await sh(sandbox, checks["ids"]),
                          "mode": sandbox.host_dir.stat().st_mode & 0o777}
                report["entrypoint"] = await sh(sandbox, "cat /tmp/entrypoint-ids")
                traced = await sandbox.exec_traced(Command(("/bin/sh", "-c", checks["ids"]), 20.0))  # the verifier's way
                report["traced"] = [traced.exit_code, traced.output.decode(), "execve(" in (traced.trace or b"").decode()]
                report["made"] = await sh(sandbox, "touch /work/made /tmp/made && mkdir -m 700 /work/private "
                                          "&& touch /work/private/f /secret/mine && touch /etc/x 2>&1")
                host = sandbox.files_dir
                report["owners"] = {path: [(host / path).lstat().st_uid, (host / path).lstat().st_gid]
                                    for path in ("etc", "work", "work/made", "tmp/made", "work/private")}
                report["changes"] = await sandbox.agent_changes()
                report["attempts"] = {attempt: await sh(sandbox, f"{attempt} 2>&1") for attempt in checks["attempts"]}
                report["keeper"] = await sh(sandbox, checks["keeper"])
                await sandbox.upload_tar(archive(), "/opt/harness")  # as root, where the user cannot write
                report["secret"] = await sh(sandbox, "cat /opt/harness/secret 2>&1")
                read = await sandbox.download_tar(["/opt/harness/secret"], limit=1 << 20)
                with tarfile.open(fileobj=io.BytesIO(read)) as got:
                    report["downloaded"] = got.extractfile("opt/harness/secret").read().decode()
                beat = "i=0; while :; do i=$((i+1)); echo $i > /tmp/beat; sleep 0.02; done"
                wait = 'n=0; while [ $n -lt 50 ]; do n=$((n+1)); read b 2>/dev/null </tmp/beat && [ -n "$b" ] && break; '
                wait += "sleep 0.1; done; echo $b"  # the writer's first beat, however loaded the machine
                started = f"setsid sh -c '{beat}' </dev/null >/dev/null 2>&1 & {wait}"
                report["writer"] = await sh(sandbox, started)
                await sandbox.kill_agent_processes()
                report["beats"] = [await sh(sandbox, "cat /tmp/beat"), await sh(sandbox, "sleep 0.3; cat /tmp/beat")]
                report["after_kill"] = await sh(sandbox, checks["ids"] + "; ls /work")
            reports.append(report)
        print(json.dumps({"reports": reports}))

    asyncio.run(main())
    """)


def _libraries(programs: tuple[str, ...]) -> tuple[str, ...]:
    """``programs`` and the libraries they load (``ldd``), for an image made of the host's files."""
    found: set[str] = set()
    for program in programs:
        listed = subprocess.run(["ldd", program], capture_output=True, text=True, check=True).stdout
        found.update(word for word in listed.split() if word.startswith("/"))
    return (*programs, *sorted(found))


@pytest.fixture
def scratch_dir() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="termgym-test-rootless-user-", dir="/tmp"))
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)


real = [
    pytest.mark.skipif(isinstance(MADE, str), reason=str(MADE)),
    pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="Debian's python3.11 runs termgym as another user"),
]


@real[0]
@real[1]
@pytest.mark.skipif(shutil.which("umoci") is None, reason="umoci makes the image")
def test_without_root_the_agent_runs_as_the_images_user_in_the_users_subordinate_ids(scratch_dir):
    assert not isinstance(MADE, str)
    uid, gid, uid_start, gid_start = MADE
    home = nobody_home(scratch_dir, uid, gid)
    files = {"etc/passwd": PASSWD, "etc/group": GROUP, "work/.keep": "", "tmp/.keep": "", "opt/.keep": ""}
    files["entry.sh"] = f'#!/bin/sh\n({IDS}) > /tmp/entrypoint-ids\nexec "$@"\n'  # as the USER, as on Docker
    ref = tiny_image(scratch_dir, _libraries(PROGRAMS), files, entrypoint="/entry.sh")
    context = scratch_dir / "context"
    context.mkdir()
    steps = "RUN chown 1000:1000 /work && chmod 1777 /tmp && mkdir -m 700 /secret && chown 1000:1000 /secret"
    (context / "Dockerfile").write_text(f"FROM {ref}\n{steps}\nUSER app\n")
    subprocess.run(["chmod", "-R", "a+rX", str(context)], check=True)
    attempts = {**ATTEMPTS, "touch /.termgym-*/sh": "Permission denied"}  # the host's kit the harness runs
    checks = json.dumps({"ids": IDS, "attempts": list(attempts), "keeper": KEEPER})
    reports = run_as_nobody(SCRIPT, [str(context), checks], home, uid=uid, gid=gid)["reports"]
    user = [uid_start + 999, gid_start + 999]  # 1000 inside: the 1000th id of the range
    for start, report in enumerate(reports):
        assert (report["prepared"] is None) == (start == 0), report["prepared"]
        assert not [warning for warning in report["warnings"] if "USER" in warning], report["warnings"]
        assert report["ids"] == [0, "Uid: 1000\nGid: 1000\nGroups: 2000 \n"]
        assert report["entrypoint"] == [0, "Uid: 1000\nGid: 1000\nGroups: 2000 \n"], report["entrypoint"]
        assert report["traced"] == [0, "Uid: 1000\nGid: 1000\nGroups: 2000 \n", True], report["traced"]
        assert report["made"] == [1, "touch: cannot touch '/etc/x': Permission denied\n"]
        assert report["owners"] == {
            "etc": [uid, gid],  # the image's root: this user
            "work": user,  # chowned by the Dockerfile's RUN, kept by the prepared layer
            "work/made": user,
            "tmp/made": user,
            "work/private": user,
        }, report["owners"]
        changes = report["changes"]
        assert {
            "/work/made": "A",
            "/tmp/made": "A",
            "/work/private/f": "A",  # listed in a directory of the range that only its owner reads
            "/secret/mine": "A",  # in one the prepared layer (a lower layer) made so
        }.items() <= changes.items()
        for attempt, refusal in attempts.items():
            code, text = report["attempts"][attempt]
            assert code != 0 and refusal in text, (attempt, code, text)
        assert report["keeper"] == [0, "CapPrm: 0000000000000000\nCapBnd: 0000000000000000\n"]
        assert report["secret"] == [1, "cat: /opt/harness/secret: Permission denied\n"]
        assert report["downloaded"] == "ok"
        first, second = report["beats"]  # a detached writer of the USER's ended with the kill step
        assert report["writer"][1].strip().isdigit() and first == second and first[0] == 0, report
        assert report["after_kill"] == [0, "Uid: 1000\nGid: 1000\nGroups: 2000 \nmade\nprivate\n"]
        assert report["mode"] == 0o700  # no other host user reaches a set-user-id program of the range in it
        assert not Path(report["dir"]).exists()  # removed, its files of the range too
    (entry,) = [path for path in (home / "cache" / "envs").iterdir() if (path / "meta.json").exists()]
    work = (entry / "tree" / "upper" / "work").stat()
    assert [work.st_uid, work.st_gid] == user  # the prepared layer keeps its owners
    (rootfs,) = (home / "cache" / "images" / "images").glob("*/rootfs")  # the image: this user's alone, unchanged
    assert {path.lstat().st_uid for path in rootfs.rglob("*")} == {uid} and not (rootfs / "work" / "made").exists()


HOST_SCRIPT = textwrap.dedent("""\
    import asyncio, json, site, sys
    from pathlib import Path
    site.addsitedir(sys.argv[1])
    from termgym.sandboxes.base import SandboxSpec
    from termgym.sandboxes.local import LocalSandbox

    async def main():
        context = Path(sys.argv[2])
        async with LocalSandbox(SandboxSpec("rootless-host", context, context / "Dockerfile")) as sandbox:
            ran = await sandbox.exec(["/bin/sh", "-c", "id -u"], timeout=20)
            print(json.dumps({"output": ran.text, "warnings": sandbox.warnings}))

    asyncio.run(main())
    """)


@real[0]
@real[1]
def test_without_root_over_the_hosts_system_the_user_stays_a_warning(scratch_dir):
    """No holder there (the host's /usr and /etc, no overlay): even with subordinate ids the
    ``USER`` is a warning and commands run as the sandbox's root, as before."""
    assert not isinstance(MADE, str)
    uid, gid, _, _ = MADE
    home = nobody_home(scratch_dir, uid, gid)
    context = scratch_dir / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM termgym/base:bookworm\nUSER nobody\n")
    subprocess.run(["chmod", "-R", "a+rX", str(context)], check=True)
    report = run_as_nobody(HOST_SCRIPT, [str(context)], home, uid=uid, gid=gid)
    assert report["output"] == "0\n", report
    warning = (
        "USER nobody ignored: without root the embedded backend runs every command as root (over the host's system)"
    )
    assert warning in report["warnings"], report["warnings"]


REMOVAL = textwrap.dedent("""\
    import json, site, subprocess, sys
    from pathlib import Path
    site.addsitedir(sys.argv[1])
    from termgym.sandboxes.local.home import remove_sandbox_dir
    from termgym.sandboxes.local.subids import mapped_argv, subordinate_ids

    ids, tree = subordinate_ids(), Path(sys.argv[2])
    made = "mkdir -p $1/a/b && touch $1/a/b/f && chown -R 1000:1000 $1/a && chmod 700 $1/a/b $1/a"
    subprocess.run(mapped_argv(ids, ["sh", "-c", made, "sh", str(tree)]), check=True)
    owner = (tree / "a").stat().st_uid
    remove_sandbox_dir(tree)  # what a killed run leaves to termgym gc, too
    print(json.dumps({"ids": [ids.uid, ids.uid_start, ids.gid_start], "owner": owner, "left": tree.exists()}))
    """)


@real[0]
@real[1]
def test_a_tree_of_the_range_that_this_user_cannot_enter_is_removed(scratch_dir):
    """``remove_sandbox_dir`` (stop and ``termgym gc``): a directory of the range, mode 0700, which
    this user cannot enter on the host, goes as the root of a namespace mapping the range."""
    assert not isinstance(MADE, str)
    uid, gid, uid_start, gid_start = MADE
    home = nobody_home(scratch_dir, uid, gid)
    report = run_as_nobody(REMOVAL, [str(home / "tree")], home, uid=uid, gid=gid)
    assert report == {"ids": [uid, uid_start, gid_start], "owner": uid_start + 999, "left": False}, report


PROBE = textwrap.dedent("""\
    import json, site, subprocess, sys
    site.addsitedir(sys.argv[1])
    from termgym.sandboxes.local.subids import subordinate_ids

    code = "import site, sys; site.addsitedir(sys.argv[1]); from termgym.sandboxes.local.subids import subordinate_ids; "
    code += "print(subordinate_ids() is None)"
    held = subprocess.run(["setpriv", "--no-new-privs", sys.executable, "-c", code, sys.argv[1]], capture_output=True, text=True)
    print(json.dumps({"here": subordinate_ids() is None, "no_new_privs": held.stdout.strip(), "err": held.stderr[-300:]}))
    """)


@real[0]
@real[1]
def test_subordinate_ids_are_none_where_newuidmap_cannot_raise_this_process(scratch_dir):
    """Under ``no_new_privs`` (a service run with NoNewPrivileges=yes) the set-user-id ``newuidmap``
    cannot map the range: none, so the ``USER`` is the warning, not a sandbox that fails to start."""
    assert not isinstance(MADE, str)
    uid, gid, _, _ = MADE
    home = nobody_home(scratch_dir, uid, gid)
    report = run_as_nobody(PROBE, [], home, uid=uid, gid=gid)
    assert report["here"] is False and report["no_new_privs"] == "True", report
