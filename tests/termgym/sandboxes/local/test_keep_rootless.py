"""``--keep`` over an image when termgym does not run as root, for real as ``nobody``: the holder
that mounts the sandbox's root (``termgym.sandboxes.local.holder``) is started again detached, so
the root outlives termgym with the keeper; ``attach`` enters it from another process and finds the
agent's file; ``termgym gc`` ends the keeper and the holder and removes the directory, leaving no
process, mount or directory. A holder whose pid another process took is never signalled."""

from __future__ import annotations

import os
import subprocess
import tempfile
import textwrap
from pathlib import Path

import pytest

from termgym.sandboxes.host_processes import alive, same_process
from termgym.sandboxes.local.namespace import namespace_mountinfos
from tests.termgym.sandboxes.local.tiny_images import tiny_image
from tests.termgym.sandboxes.local.unprivileged import NOBODY, SYSTEM_PYTHON, nobody_home, run_as_nobody, subid_user

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="runs termgym as another, unprivileged uid"),
    pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="Debian's python3.11 runs termgym as nobody"),
]

KEEP = textwrap.dedent("""\
    import asyncio, json, site, sys
    from pathlib import Path
    site.addsitedir(sys.argv[1])
    from termgym.sandboxes.base import ROOT, SandboxSpec
    from termgym.sandboxes.local import LocalSandbox

    async def main():
        context = Path(sys.argv[3]) if sys.argv[3] else None  # a Dockerfile with a USER
        image = None if context else sys.argv[2]  # else the Dockerfile's FROM
        spec = SandboxSpec("rootless-kept", context, context and context / "Dockerfile", image=image)
        async with LocalSandbox(spec) as sandbox:
            write = ["/bin/sh", "-c", "echo by-the-agent > /usr/agent-file"]
            ran = await sandbox.exec(write, timeout=20, user=ROOT)
            first_holder = sandbox._holder.pid
            kept = await sandbox.keep()
            state = json.loads((sandbox.host_dir / "kept.json").read_text())
        print(json.dumps({"code": ran.exit_code, "kept": kept, "state": state, "first_holder": first_holder,
                          "user": sandbox.default_user, "warnings": sandbox.warnings}))

    asyncio.run(main())
    """)

ATTACH = textwrap.dedent("""\
    import asyncio, json, site, sys
    site.addsitedir(sys.argv[1])
    from termgym.sandboxes.local.leftovers import attach

    async def main():
        sandbox = await attach(sys.argv[2])
        ran = await sandbox.exec(["/bin/sh", "-c", "read line < /usr/agent-file; echo $line"], timeout=20)
        print(json.dumps({"output": ran.text, "code": ran.exit_code}))  # left kept: no stop()

    asyncio.run(main())
    """)

# Attached, then a kill step (as verification runs one): the sandbox is no longer kept, so its root's
# mount must die with this process again; it exits without stop(), as a killed process would.
ATTACH_KILL = textwrap.dedent("""\
    import asyncio, json, site, sys
    site.addsitedir(sys.argv[1])
    from termgym.sandboxes.local.leftovers import attach

    async def main():
        sandbox = await attach(sys.argv[2])
        await sandbox.kill_agent_processes()
        ran = await sandbox.exec(["/bin/sh", "-c", "read line < /usr/agent-file; echo $line"], timeout=20)
        print(json.dumps({"output": ran.text, "holder": sandbox._holder.pid if sandbox._holder else None}))

    asyncio.run(main())
    """)

GC = textwrap.dedent("""\
    import json, site, sys
    site.addsitedir(sys.argv[1])
    from termgym.sandboxes.local.leftovers import collect_sandboxes

    print(json.dumps({"removed": collect_sandboxes()}))
    """)


def _naming(text: str) -> list[str]:
    """The command lines of the processes that name ``text`` (a sandbox's directory)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            line = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if entry.isdigit() and int(entry) != os.getpid() and text in line:
            found.append(line)
    return found


MADE = subid_user()


@pytest.mark.parametrize("who", ["nobody", "a USER in subordinate ids"])
def test_a_sandbox_over_an_image_is_kept_attached_and_collected_without_root(who):
    """As ``nobody``; and as a user with subordinate ids over an image whose ``USER`` its holder's
    namespace maps (``subids``: attach enters it as root enters)."""
    mapped = who != "nobody"
    if mapped and isinstance(MADE, str):
        pytest.skip(MADE)
    uid, gid = (MADE[0], MADE[1]) if mapped and not isinstance(MADE, str) else (NOBODY, NOBODY)
    scratch = Path(tempfile.mkdtemp(prefix="termgym-test-rootless-keep-", dir="/tmp"))
    holder = keeper = None
    try:
        home = nobody_home(scratch, uid, gid)
        ref = tiny_image(scratch, (), {"etc/marker": "from-the-image\n"})
        context = ""
        if mapped:
            (scratch / "context").mkdir()
            (scratch / "context" / "Dockerfile").write_text(f"FROM {ref}\nUSER 1000:1000\n")
            subprocess.run(["chmod", "-R", "a+rX", str(scratch / "context")], check=True)
            context = str(scratch / "context")
        kept = run_as_nobody(KEEP, [ref, context], home, uid=uid, gid=gid)
        assert kept["code"] == 0, kept
        assert kept["user"] == ("1000:1000" if mapped else "") and kept["state"]["mapped_ids"] == mapped, kept
        state, name = kept["state"], kept["kept"]["id"]
        holder, keeper = (int(state["holder"][0]), state["holder"][1]), (int(state["bwrap"][0]), state["bwrap"][1])
        # termgym has exited: the holder it started first died with it, the detached one and the keeper live on
        assert not alive(kept["first_holder"]) and holder[0] != kept["first_holder"]
        assert same_process(*holder) and same_process(*keeper), state
        assert _naming(name)  # the check below sees the sandbox's processes while they run
        assert os.stat(f"/proc/{holder[0]}").st_uid == uid
        directory = home / "sandboxes" / name
        assert any(str(directory) in table for table in namespace_mountinfos())  # the root's mount, the holder's

        attached = run_as_nobody(ATTACH, [name], home, uid=uid, gid=gid)
        assert attached == {"output": "by-the-agent\n", "code": 0}, attached
        assert same_process(*holder) and same_process(*keeper)  # attach left it kept

        collected = run_as_nobody(GC, [], home, uid=uid, gid=gid)
        assert collected["removed"] == [[name, True]], collected
        assert not alive(holder[0]) and not alive(keeper[0])
        assert not _naming(name), _naming(name)  # nor any process of the sandbox (its init, its sleep)
        assert not directory.exists()
        assert not any(str(directory) in table for table in namespace_mountinfos())
    finally:
        for pid in (holder, keeper):  # a failed test leaves nothing running
            if pid is not None and same_process(*pid):
                os.kill(pid[0], 9)
        subprocess.run(["rm", "-rf", str(scratch)], check=False)


def test_a_kept_state_whose_holder_pid_was_reused_is_neither_entered_nor_signalled(tmp_path):
    """kept.json names a holder by pid and start time: a live process of that pid but another start
    (pid reuse) makes the sandbox not kept for ``read_kept`` (attach), and gc never kills it."""
    import json

    from termgym.sandboxes.host_processes import start_time
    from termgym.sandboxes.local.kept import KEPT_STATE, end_kept, read_kept

    bystander = subprocess.Popen(["sleep", "60"])
    keeper = subprocess.Popen(["sleep", "60"])
    try:
        state = {
            "bwrap": [keeper.pid, start_time(keeper.pid)],
            "keeper": keeper.pid,
            "keeper_start": start_time(keeper.pid),
            "holder": [bystander.pid, (start_time(bystander.pid) or 0) - 1],  # its pid, not its start
        }
        (tmp_path / KEPT_STATE).write_text(json.dumps(state))
        assert read_kept(tmp_path) is None
        assert end_kept(tmp_path)  # the keeper it names is ended; the bystander is not
        assert keeper.wait(timeout=10) is not None
        assert bystander.poll() is None
        state["holder"][1] += 1
        state["bwrap"] = [bystander.pid, start_time(bystander.pid)]
        (tmp_path / KEPT_STATE).write_text(json.dumps(state))
        assert end_kept(tmp_path) and bystander.wait(timeout=10) is not None  # its own start time: ended
    finally:
        for process in (bystander, keeper):
            process.kill()
            process.wait()


def test_an_attached_sandbox_that_stops_being_kept_takes_its_root_s_mount_along():
    """After a kill step in the attaching process (no longer kept: kept.json goes), the detached
    holder is ended and the root mounted by one that dies with that process, so a process that
    ends without ``stop`` leaves no holder for gc to miss; gc then removes the directory."""
    scratch = Path(tempfile.mkdtemp(prefix="termgym-test-rootless-keep-kill-", dir="/tmp"))
    holder = None
    try:
        home = nobody_home(scratch)
        ref = tiny_image(scratch, (), {"etc/marker": "from-the-image\n"})
        kept = run_as_nobody(KEEP, [ref, ""], home)
        name, state = kept["kept"]["id"], kept["state"]
        holder = (int(state["holder"][0]), state["holder"][1])
        assert state["layers"] and same_process(*holder), state
        attached = run_as_nobody(ATTACH_KILL, [name], home)
        assert attached["output"] == "by-the-agent\n" and attached["holder"] not in (None, holder[0]), attached
        assert not alive(holder[0]) and not alive(attached["holder"])  # each ended with its owner
        assert not (home / "sandboxes" / name / "kept.json").exists()
        assert not _naming(name), _naming(name)
        collected = run_as_nobody(GC, [], home)
        assert collected["removed"] == [[name, False]], collected
        assert not (home / "sandboxes" / name).exists()
    finally:
        if holder is not None and same_process(*holder):
            os.kill(holder[0], 9)
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
