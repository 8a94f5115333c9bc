"""An image's ENTRYPOINT in the embedded backend, run as Docker runs it: before the agent's first
command, and again after each kill step (before the verifier's first command), its services in
the sandbox and ended with it. The image is an OCI layout made here with umoci: dash, sleep and
their libraries, and an entrypoint script."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from termgym.sandboxes.base import Sandbox, SandboxSpec
from termgym.sandboxes.local import LocalSandbox
from termgym.sandboxes.local.entrypoint import MARK, marked_command, ready_in
from tests.termgym.sandboxes.local.tiny_images import tiny_image

pytestmark = pytest.mark.skipif(shutil.which("umoci") is None, reason="umoci makes the image")

SERVICE = """#!/bin/sh
sleep 1000 &
echo $! > /run/service.pid
echo started >> /run/starts
exec "$@"
"""
FAILING = "#!/bin/sh\necho no >&2\nexit 3\n"
UP = 'read p < /run/service.pid && kill -0 "$p" && echo "up $p"'
STARTS = "n=0; while read l; do n=$((n + 1)); done < /run/starts; echo $n"


def entrypoint_image(root: Path, script: str) -> str:
    """An image whose entrypoint is ``script`` (at /entry.sh), with sleep and an empty /run."""
    return tiny_image(root, ("/usr/bin/sleep",), {"entry.sh": script, "run/.keep": ""}, entrypoint="/entry.sh")


async def up(sandbox: LocalSandbox) -> int:
    ran = await sandbox.exec(["/bin/sh", "-c", UP], timeout=20)
    assert ran.exit_code == 0 and ran.text.startswith("up "), ran.text
    return int(ran.text.split()[1])


async def test_the_entrypoints_service_is_up_for_the_agent_and_again_after_each_kill_step(scratch, no_leaks):
    sandbox = LocalSandbox(SandboxSpec("entrypoint", None, None, image=entrypoint_image(scratch, SERVICE)))
    async with sandbox:
        await up(sandbox)
        assert await sandbox.agent_changes() == {}  # what it wrote before the agent's first command
        assert "/entry.sh" in sandbox.untraced_loads  # a rewritten one would run before the verifier
        for restarts in (2, 3):
            await sandbox.kill_agent_processes()  # its service ends with every other process
            await up(sandbox)  # the next command (the verifier's) finds it started again
            assert (await sandbox.exec(["/bin/sh", "-c", STARTS], timeout=20)).text == f"{restarts}\n"
        assert not [w for w in sandbox.warnings if "entrypoint" in w], sandbox.warnings


async def test_an_entrypoint_that_exits_is_one_warning_and_commands_still_run(scratch, no_leaks):
    sandbox = LocalSandbox(SandboxSpec("entrypoint-fails", None, None, image=entrypoint_image(scratch, FAILING)))
    async with sandbox:
        ran = await sandbox.exec(["/bin/sh", "-c", "echo here"], timeout=20)
        assert ran.text == "here\n"
        (warning,) = [w for w in sandbox.warnings if "entrypoint" in w]
        assert "/entry.sh" in warning and "exited (3)" in warning, warning
        log = sandbox.host_dir / "entrypoint.log" if sandbox.host_dir else None
        assert log is not None and log.read_text() == "no\n"


def test_the_marked_command_is_found_by_its_last_word():
    command = marked_command(["/k/ld.so", "/k/sleep"])
    assert command[-1] == MARK and command[-2] == "infinity"
    line = "\0".join(command).encode() + b"\0"
    assert ready_in({7: b"/bin/sh\0/entry.sh\0", 8: line}, command)
    assert not ready_in({7: b"/bin/sh\0/entry.sh\0" + line}, command)  # the entrypoint holding it as arguments
    assert not ready_in({}, command)


# -- the Dockerfile's own ENTRYPOINT over the image's ------------------------------------------

OTHER = '#!/bin/sh\necho "other $1" >> /run/starts\nshift\nexec "$@"\n'
READ_STARTS = 'if [ -f /run/starts ]; then while IFS= read -r l; do echo "$l"; done < /run/starts; else echo none; fi'


async def starts(sandbox: Sandbox) -> str:
    return (await sandbox.exec(["/bin/sh", "-c", READ_STARTS], timeout=20)).text


def task_over(scratch: Path, name: str, dockerfile: str) -> SandboxSpec:
    """A task whose Dockerfile starts FROM the image with /entry.sh as its entrypoint (/other.sh beside it)."""
    if not (scratch / "layout").exists():
        files = {"entry.sh": SERVICE, "other.sh": OTHER, "run/.keep": ""}
        tiny_image(scratch, ("/usr/bin/sleep",), files, entrypoint="/entry.sh")
    context = scratch / name
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM oci:{scratch / 'layout'}:1\n{dockerfile}")
    return SandboxSpec(name, context, context / "Dockerfile")


@pytest.mark.parametrize("prepared", [False, True], ids=["no-steps", "prepared-layer"])
async def test_the_dockerfiles_entrypoint_replaces_the_images(scratch, no_leaks, prepared):
    steps = "RUN echo made > /made\n" if prepared else ""
    spec = task_over(scratch, "other", steps + 'ENTRYPOINT ["/entry.sh"]\nENTRYPOINT ["/other.sh", "-x"]\n')
    for start in (1, 2):  # the second from the prepared layer the first kept
        async with LocalSandbox(spec) as sandbox:
            assert await starts(sandbox) == "other -x\n"
            await sandbox.kill_agent_processes()  # run again at the restart; the image's never
            assert await starts(sandbox) == "other -x\n" * 2
            assert "/other.sh" in sandbox.untraced_loads and "/entry.sh" not in sandbox.untraced_loads
            assert ("prepared" in sandbox.image) == (prepared and start == 2), sandbox.image
            assert not [w for w in sandbox.warnings if "entrypoint" in w.lower()], sandbox.warnings


async def test_an_empty_entrypoint_clears_the_images_and_the_shell_form_runs_under_sh(scratch, no_leaks):
    cleared = task_over(scratch, "cleared", 'RUN echo made > /made\nENTRYPOINT ["/entry.sh"]\nENTRYPOINT []\n')
    shell = task_over(
        scratch, "shell", 'RUN echo made > /made\nENTRYPOINT echo "sh $0" >> /run/starts; exec "$0" "$@"\n'
    )
    prepared = []
    for spec in (cleared, cleared, shell, shell):  # each second one from the prepared layer the first kept
        async with LocalSandbox(spec) as sandbox:
            prepared.append(sandbox.image.get("prepared"))
            text = await starts(sandbox)
            if spec is cleared:
                assert text == "none\n" and "/entry.sh" not in sandbox.untraced_loads
            else:  # /bin/sh -c TEXT KEEPER...: $0 is the keeper's first word (the kit's loader)
                assert text.startswith("sh /.termgym-") and text.endswith("/ld.so\n"), text
            assert not [w for w in sandbox.warnings if "entrypoint" in w.lower()], sandbox.warnings
    # the Dockerfiles differ in their ENTRYPOINT alone: two prepared environments
    assert prepared[0] is None and prepared[2] is None and None not in (prepared[1], prepared[3])
    assert prepared[1] != prepared[3]
