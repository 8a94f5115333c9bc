"""The system calls an embedded sandbox is refused: a seccomp program (classic BPF) for this machine,
and the numbers of the calls that install it (the guard in ``termgym.sandboxes.local.commands``).

Refused, as Docker's default profile refuses them, with ``EPERM``: the kernel's key management
(``add_key``, ``request_key``, ``keyctl``). Every process inherits the session keyring of the one
that started it, through ``bwrap`` and ``nsenter`` and into every namespace, so without this a
sandbox read the keys of termgym's session keyring (any login through pam_keyinit, ``su -l``,
``runuser``, a systemd service has one), added keys to it (a change on the host that outlives the
trial) and saw the keys earlier trials had added.

Guaranteed: the program refuses these calls under every ABI this machine's kernel runs (x86-64, with
its x32 numbering, and i386; arm64 and 32-bit arm), kills a process that calls through any other
ABI, and allows everything else. Pure: bytes out, no I/O.
"""

from __future__ import annotations

import errno
import platform
import struct
from dataclasses import dataclass

from termgym.errors import BackendUnavailable

# <linux/audit.h>: which ABI a system call came through (seccomp_data.arch)
AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
AUDIT_ARCH_AARCH64 = 0xC00000B7
AUDIT_ARCH_ARM = 0x40000028
X32_SYSCALL_BIT = 0x40000000  # x32 calls come as x86-64 ones with this bit set, same numbers

# <linux/seccomp.h> and <linux/filter.h>
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
BPF_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS: load a word of seccomp_data
BPF_ALU_AND_K = 0x54  # BPF_ALU | BPF_AND | BPF_K
BPF_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
BPF_RET_K = 0x06  # BPF_RET | BPF_K
NR_OFFSET, ARCH_OFFSET = 0, 4  # struct seccomp_data: int nr; __u32 arch; ...

REFUSED = ("add_key", "request_key", "keyctl")


@dataclass(frozen=True)
class Abi:
    """One way into the kernel: its audit arch and its numbers for ``REFUSED``, in that order."""

    arch: int
    refused: tuple[int, int, int]
    nr_mask: int = 0xFFFFFFFF  # applied to the number before comparing (x32: clears its bit)


@dataclass(frozen=True)
class Machine:
    """A machine's ABIs (its native one first) and its own numbers for the calls the guard makes."""

    abis: tuple[Abi, ...]
    prctl: int
    seccomp: int
    setns: int
    setgroups: int
    setresuid: int
    setresgid: int
    capget: int
    capset: int
    prlimit64: int
    unshare: int
    setitimer: int
    close_range: int = 436  # the same number on every architecture

    def guard_numbers(self) -> str:
        """The numbers the guard calls, comma-separated, in the order its script reads them."""
        calls = (self.prctl, self.seccomp, self.close_range, self.setns, self.setgroups, self.setresuid)
        return ",".join(
            str(n)
            for n in (*calls, self.setresgid, self.capget, self.capset, self.prlimit64, self.unshare, self.setitimer)
        )


MACHINES = {
    "x86_64": Machine(
        (Abi(AUDIT_ARCH_X86_64, (248, 249, 250), ~X32_SYSCALL_BIT & 0xFFFFFFFF), Abi(AUDIT_ARCH_I386, (286, 287, 288))),
        prctl=157,
        seccomp=317,
        setns=308,
        setgroups=116,
        setresuid=117,
        setresgid=119,
        capget=125,
        capset=126,
        prlimit64=302,
        unshare=272,
        setitimer=38,
    ),
    "aarch64": Machine(
        (Abi(AUDIT_ARCH_AARCH64, (217, 218, 219)), Abi(AUDIT_ARCH_ARM, (309, 310, 311))),
        prctl=167,
        seccomp=277,
        setns=268,
        setgroups=159,
        setresuid=147,
        setresgid=149,
        capget=90,
        capset=91,
        prlimit64=261,
        unshare=97,
        setitimer=103,
    ),
}


def this_machine() -> Machine:
    """This machine's ``Machine``; ``BackendUnavailable`` on one the filter does not know."""
    name = platform.machine()
    if name not in MACHINES:
        raise BackendUnavailable(
            f"the embedded backend has no seccomp filter for {name} (only {', '.join(MACHINES)}); use --backend docker"
        )
    return MACHINES[name]


def program(machine: Machine) -> bytes:
    """The seccomp program (``struct sock_filter`` entries, native byte order) refusing ``REFUSED``
    with ``EPERM`` under ``machine``'s ABIs and killing a process that uses another ABI."""
    blocks = [_abi_block(abi) for abi in machine.abis]
    # The dispatch on the ABI: comparison i jumps over the comparisons after it and the kill, then
    # over the blocks before its own (a jump of k goes to the instruction k + 1 further on).
    dispatch = [(BPF_LD_W_ABS, 0, 0, ARCH_OFFSET)]
    start = 0
    for i, (abi, block) in enumerate(zip(machine.abis, blocks)):
        dispatch.append((BPF_JEQ_K, len(blocks) - i + start, 0, abi.arch))
        start += len(block)
    dispatch.append((BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS))
    instructions = dispatch + [instruction for block in blocks for instruction in block]
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in instructions)


def _abi_block(abi: Abi) -> list[tuple[int, int, int, int]]:
    """Load the call's number; each comparison with a refused one jumps over the comparisons after
    it and the ALLOW to the EPERM at the end."""
    block = [(BPF_LD_W_ABS, 0, 0, NR_OFFSET)]
    if abi.nr_mask != 0xFFFFFFFF:
        block.append((BPF_ALU_AND_K, 0, 0, abi.nr_mask))
    block += [(BPF_JEQ_K, len(abi.refused) - i, 0, number) for i, number in enumerate(abi.refused)]
    return [*block, (BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW), (BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | errno.EPERM)]
