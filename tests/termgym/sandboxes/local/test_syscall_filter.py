"""The seccomp program every embedded sandbox runs under, and the guard that installs it.

The program is checked by running it, as the kernel would, on the calls of every ABI it knows; the
guard by starting a real process under it (the red-team tests attack the keyrings through a sandbox:
tests/redteam/test_keyrings.py).
"""

from __future__ import annotations

import errno
import os
import struct
import subprocess

import pytest

from termgym.sandboxes.local.commands import within_limits
from termgym.sandboxes.local.syscall_filter import (
    AUDIT_ARCH_AARCH64,
    AUDIT_ARCH_ARM,
    AUDIT_ARCH_I386,
    AUDIT_ARCH_X86_64,
    MACHINES,
    SECCOMP_RET_ALLOW,
    SECCOMP_RET_ERRNO,
    SECCOMP_RET_KILL_PROCESS,
    X32_SYSCALL_BIT,
    program,
)

EPERM = SECCOMP_RET_ERRNO | errno.EPERM
ALLOW, KILL = SECCOMP_RET_ALLOW, SECCOMP_RET_KILL_PROCESS


def verdict(filter_program: bytes, arch: int, nr: int) -> int:
    """What the kernel's classic-BPF interpreter returns for a call ``nr`` through ``arch`` (only
    the instructions ``program`` uses; any other fails the test)."""
    data = struct.pack("=II", nr, arch)  # struct seccomp_data: nr, arch, ...
    instructions = list(struct.iter_unpack("=HBBI", filter_program))
    pc, accumulator = 0, 0
    for _ in range(len(instructions)):  # classic BPF only jumps forward
        code, jump_true, jump_false, k = instructions[pc]
        pc += 1
        if code == 0x20:
            (accumulator,) = struct.unpack_from("=I", data, k)
        elif code == 0x54:
            accumulator &= k
        elif code == 0x15:
            pc += jump_true if accumulator == k else jump_false
        elif code == 0x06:
            return k
        else:
            raise AssertionError(f"unexpected instruction {code:#x}")
    raise AssertionError("the program ran off its end")


@pytest.mark.parametrize(
    ("machine", "arch", "nr", "expected"),
    [
        # x86-64: add_key, request_key, keyctl; the same through x32; through i386; others allowed
        ("x86_64", AUDIT_ARCH_X86_64, 248, EPERM),
        ("x86_64", AUDIT_ARCH_X86_64, 249, EPERM),
        ("x86_64", AUDIT_ARCH_X86_64, 250, EPERM),
        ("x86_64", AUDIT_ARCH_X86_64, X32_SYSCALL_BIT | 250, EPERM),
        ("x86_64", AUDIT_ARCH_X86_64, X32_SYSCALL_BIT | 248, EPERM),
        ("x86_64", AUDIT_ARCH_I386, 286, EPERM),
        ("x86_64", AUDIT_ARCH_I386, 287, EPERM),
        ("x86_64", AUDIT_ARCH_I386, 288, EPERM),
        ("x86_64", AUDIT_ARCH_X86_64, 0, ALLOW),  # read
        ("x86_64", AUDIT_ARCH_X86_64, 251, ALLOW),  # ioprio_set, next to keyctl
        ("x86_64", AUDIT_ARCH_X86_64, X32_SYSCALL_BIT | 1, ALLOW),
        ("x86_64", AUDIT_ARCH_I386, 250, ALLOW),  # fadvise64 on i386
        ("x86_64", AUDIT_ARCH_AARCH64, 219, KILL),  # an ABI this machine has not
        # arm64 and 32-bit arm
        ("aarch64", AUDIT_ARCH_AARCH64, 217, EPERM),
        ("aarch64", AUDIT_ARCH_AARCH64, 218, EPERM),
        ("aarch64", AUDIT_ARCH_AARCH64, 219, EPERM),
        ("aarch64", AUDIT_ARCH_ARM, 309, EPERM),
        ("aarch64", AUDIT_ARCH_ARM, 310, EPERM),
        ("aarch64", AUDIT_ARCH_ARM, 311, EPERM),
        ("aarch64", AUDIT_ARCH_AARCH64, 250, ALLOW),
        ("aarch64", AUDIT_ARCH_ARM, 219, ALLOW),
        ("aarch64", AUDIT_ARCH_X86_64, 250, KILL),
    ],
)
def test_the_program_refuses_the_keyring_calls_under_every_abi(machine, arch, nr, expected):
    assert verdict(program(MACHINES[machine]), arch, nr) == expected


def test_the_guard_leaves_only_the_standard_descriptors_and_installs_the_filter(tmp_path):
    with open(tmp_path / "held", "w") as held:
        script = "ls /proc/self/fd; grep -E '^(NoNewPrivs|Seccomp):' /proc/self/status"
        argv = within_limits(["/bin/sh", "-c", script], [], None)
        result = subprocess.run(argv, pass_fds=[held.fileno()], capture_output=True, text=True, check=True)
    *descriptors, no_new_privs, seccomp = result.stdout.splitlines()
    assert descriptors == ["0", "1", "2", "3"]  # 3: ls's own
    assert no_new_privs.split() == ["NoNewPrivs:", "1"] and seccomp.split() == ["Seccomp:", "2"]


def test_the_guard_refuses_to_run_a_command_it_could_not_put_in_its_cgroup(tmp_path):
    argv = within_limits(["/bin/echo", "ran"], [str(tmp_path / "gone" / "cgroup.procs")], None)
    result = subprocess.run(argv, capture_output=True, text=True, env={"PATH": os.defpath})
    assert result.returncode == 125 and result.stdout == ""
    assert "could not join the cgroup" in result.stderr
