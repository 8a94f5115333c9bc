"""How a command enters an embedded sandbox (``commands.within_limits``'s guard, as root, or the
``nsenter`` chain without root): namespaces, identity, capabilities, environment, directory and
exit status, checked from inside a real sandbox."""

from __future__ import annotations

import os
import time

import pytest

from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.local import LocalSandbox
from termgym.sandboxes.local.commands import CAPABILITY_NUMBERS, COMMAND_CAPABILITIES

DOCKER_CAPS = sum(1 << CAPABILITY_NUMBERS[name] for name in COMMAND_CAPABILITIES)
PROBE = r"""
id -u; id -g; id -G; pwd; env | sort | tr '\n' ' '; echo
for set in Inh Prm Eff Bnd Amb; do grep "^Cap$set" /proc/self/status | cut -f2; done
echo $$; readlink /proc/self/ns/pid; readlink /proc/self/ns/mnt; ls /proc/self/fd | tr '\n' ' '; echo
"""


async def test_a_command_enters_every_namespace_as_the_sandboxs_root_with_dockers_capabilities_only(tmp_path, no_leaks):
    sandbox = LocalSandbox(SandboxSpec(name="entry", context_dir=None, dockerfile=None))
    async with sandbox:
        keeper = sandbox._keeper_pid
        assert keeper is not None
        result = await sandbox.exec(
            ["/bin/sh", "-c", PROBE], timeout=30, env={"PATH": "/usr/bin:/bin", "A": "b=c"}, cwd="/tmp"
        )
        lines = result.text.splitlines()
        assert result.exit_code == 0, result.text
        assert lines[0:3] == ["0", "0", "0"]  # root inside, no supplementary group
        assert lines[3] == "/tmp"
        assert lines[4].split() == ["A=b=c", "PATH=/usr/bin:/bin", "PWD=/tmp"]  # exactly its own (sh adds PWD)
        inheritable, permitted, effective, bounding, ambient = (int(word, 16) for word in lines[5:10])
        assert (inheritable, ambient) == (0, 0)
        assert permitted == effective == bounding == DOCKER_CAPS
        assert int(lines[10]) < 20  # a small pid: the keeper's PID namespace
        for kind, line in (("pid", lines[11]), ("mnt", lines[12])):
            assert line == os.readlink(f"/proc/{keeper}/ns/{kind}")  # the keeper's, not the host's
            assert line != os.readlink(f"/proc/self/ns/{kind}")
        assert lines[13].split()[:3] == ["0", "1", "2"] and len(lines[13].split()) == 4  # and ls's own


@pytest.mark.parametrize(
    ("argv", "cwd", "code", "says"),
    [
        (["/bin/sh", "-c", "exit 3"], "/", 3, ""),
        (["/bin/sh", "-c", "kill -9 $$"], "/", 137, ""),  # ended by signal 9: 128 + 9, as Docker says it
        (["no-such-command"], "/", 127, "No such file or directory"),
        (["pwd"], "/no/such/dir", 125, "cannot change directory to '/no/such/dir'"),
    ],
)
async def test_a_commands_end_is_its_exit_status(tmp_path, no_leaks, argv, cwd, code, says):
    async with LocalSandbox(SandboxSpec(name="entry", context_dir=None, dockerfile=None)) as sandbox:
        result = await sandbox.exec(argv, timeout=30, env={"PATH": "/usr/bin:/bin"}, cwd=cwd)
        assert result.exit_code == code and says in result.text, (result.exit_code, result.text)


async def test_a_command_past_its_deadline_is_ended_with_everything_in_its_process_group(tmp_path, no_leaks):
    """The guard's deadline, as ``timeout -k 1`` would: TERM to the command's whole group, then the
    result says timed out, well before the host's backstop (the deadline plus 5 s)."""
    async with LocalSandbox(SandboxSpec(name="entry", context_dir=None, dockerfile=None)) as sandbox:
        path = {"PATH": "/usr/bin:/bin"}
        started = time.monotonic()
        result = await sandbox.exec(
            ["/bin/sh", "-c", "sleep 60 & echo $! > /tmp/background; sleep 60"], timeout=0.5, env=path, cwd="/"
        )
        took = time.monotonic() - started
        assert result.timed_out and result.exit_code is None and 0.5 <= took < 3, (result, took)
        check = await sandbox.exec(["/bin/sh", "-c", 'kill -0 "$(cat /tmp/background)"'], timeout=30, env=path, cwd="/")
        assert check.exit_code == 1, check.text  # the background job went with its group


async def test_a_command_that_ignores_term_is_killed_a_second_after_its_deadline(tmp_path, no_leaks):
    async with LocalSandbox(SandboxSpec(name="entry", context_dir=None, dockerfile=None)) as sandbox:
        started = time.monotonic()
        result = await sandbox.exec(
            ["/bin/sh", "-c", "trap '' TERM; while :; do sleep 0.05; done"],
            timeout=0.3,
            env={"PATH": "/usr/bin:/bin"},
            cwd="/",
        )
        took = time.monotonic() - started
        assert result.timed_out and result.exit_code is None and 1.3 <= took < 4, (result, took)
