"""An image's ENTRYPOINT in the embedded backend, run as Docker runs it: before the agent's first
command, and again after each kill step (before the verifier's first command), its services in
the sandbox and ended with it. The image is an OCI layout made here with umoci: dash, sleep and
their libraries, and an entrypoint script."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from termgym.sandboxes.base import SandboxSpec
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


@pytest.fixture
def scratch() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="termgym-test-entrypoint-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)


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
