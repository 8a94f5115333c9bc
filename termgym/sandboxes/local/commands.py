"""The command lines the embedded backend runs on the host: the keeper that holds a sandbox's
namespaces, the way every command enters them, and the limits and the guard both start under.

Pure: argv lists in, argv lists out. Every host program is found by absolute path
(``termgym.sandboxes.tools.host_tool``); what runs inside the sandbox is named by its path there.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from termgym.sandboxes.host_kit import kit_argv
from termgym.sandboxes.local.holder import inside_argv
from termgym.sandboxes.local.host import bwrap_supports
from termgym.sandboxes.local.syscall_filter import program, this_machine
from termgym.sandboxes.tools import host_tool

# Docker's default capability set: what root in a container may do, without mounts, tracing,
# module loading or raw devices. Commands entered into the sandbox keep only these.
COMMAND_CAPABILITIES = tuple(
    "chown dac_override fowner fsetid kill setgid setuid setpcap net_bind_service net_raw sys_chroot mknod"
    " audit_write setfcap".split()
)
SHM_BYTES = 64 << 20
# The guard every host command of a sandbox starts with (perl-base is Essential on Debian): joins
# the cgroups named before "--" (each a cgroup.procs file), closes every descriptor but 0, 1 and 2
# (close_range), sets no_new_privs and installs the seccomp program (``syscall_filter``), then runs
# the rest: a process is in the sandbox's cgroups and under its filter before it starts, so nothing
# it forks escapes them, and it holds no descriptor of this process, whatever spawned it (uvloop's
# subprocess_exec ignores close_fds). No host tool loads a seccomp program in front of a command
# that nsenter starts (util-linux 2.38 has neither enosys nor setpriv --seccomp-filter; bwrap's
# --seccomp reaches only the keeper), and a Python preexec_fn would fork the whole termgym
# process for every command instead of vfork (17 ms at 500 MB). Its first four arguments: the
# numbers of prctl, seccomp and close_range, and the program in hex.
_GUARD = r"""
my ($prctl, $seccomp, $close_range, $filter) = splice(@ARGV, 0, 4);
sub fail { print STDERR "termgym: the sandbox guard could not $_[0]: $!\n"; exit 125 }
while (@ARGV && (my $file = shift @ARGV) ne "--") {
    open(my $procs, ">", $file) or fail("join the cgroup $file");
    print $procs "$$\n" and close $procs or fail("join the cgroup $file");
}
syscall($close_range + 0, 3, 0xFFFFFFFF, 0) == 0 or fail("close the descriptors it inherited");
syscall($prctl + 0, 38, 1, 0, 0, 0) == 0 or fail("set no_new_privs");
my $program = pack("H*", $filter);
my $fprog = pack("S x![p] p", length($program) / 8, $program);
syscall($seccomp + 0, 1, 0, $fprog) == 0 or fail("install the seccomp filter");
exec { $ARGV[0] } @ARGV;
fail("run $ARGV[0]");
"""
# The keeper says "ready" once the sandbox is fully set up; commands enter its namespaces.
KEEPER_COMMAND = ("/bin/sh", "-c", "echo ready; exec /bin/sleep infinity")
# What a sandbox over an image runs from the host's kit (``host_kit``) rather than its own root.
KIT_PROGRAMS = ("strace", "setpriv", "env", "timeout", "nsenter", "sh", "sleep")


@dataclass(frozen=True)
class ImageRoot:
    """A sandbox's whole root from the host directory ``root`` (an overlay over an image), with
    the host's ``kit`` (``KIT_PROGRAMS``) bound read-only at ``kit_at``: the keeper and the way
    into the sandbox run from it, never from the root the agent may change."""

    root: Path
    kit: Path
    kit_at: str
    resolv: Path | None = None  # the host's resolver configuration, bound read-only at /etc/resolv.conf
    holder: int | None = None  # without root: the process whose namespaces hold the overlay (``holder``)

    @property
    def mount_points(self) -> tuple[str, ...]:
        """What bubblewrap binds into the root (made in its upper layer where the image lacks it)."""
        return (self.kit_at, *(("/etc/resolv.conf",) if self.resolv is not None else ()))


def keeper_argv(
    files_dir: Path,
    roots: Sequence[str],
    uid: int | None,
    *,
    detached: bool = False,
    image: ImageRoot | None = None,
    mount_namespace: str | None = None,
) -> list[str]:
    """bubblewrap's command line for a sandbox whose writable roots are ``files_dir/<root>`` over
    the host's read-only ``/usr`` and ``/etc`` (or, with ``image``, whose root is that image's),
    run as the host ``uid`` (None: this process's user), started in the sandbox's own
    ``mount_namespace`` (a file ``nsenter --mount`` opens; ``termgym.sandboxes.local.namespace``)
    where it has one; ``detached`` (a kept sandbox): without ``--die-with-parent``. To be run
    ``within_limits``."""
    userns = ("--disable-userns",) if bwrap_supports("--disable-userns") else ()
    options = [
        ("--unshare-all", "--unshare-user", *userns),
        ("--uid", "0", "--gid", "0", "--hostname", "termgym"),
        ("--new-session",) if detached else ("--die-with-parent", "--new-session"),
    ]
    if image is None:
        options += [
            ("--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"),
            ("--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib"),
            ("--symlink", "usr/lib64", "/lib64", "--symlink", "usr/sbin", "/sbin"),
        ]
    else:
        options += [("--bind", str(image.root), "/")]
    options += [("--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys", "--dev", "/dev")]
    argv = [host_tool("bwrap"), *(arg for group in options for arg in group)]
    if bwrap_supports("--size"):
        argv += ["--size", str(SHM_BYTES), "--tmpfs", "/dev/shm"]
    if image is None:
        for name in roots:
            argv += ["--bind", str(files_dir / name), f"/{name}"]
        argv += ["--remount-ro", "/", "--chdir", "/", "--clearenv", "--", *KEEPER_COMMAND]
    else:
        sleep = " ".join(kit_argv(image.kit_at, "sleep"))
        keeper = [*kit_argv(image.kit_at, "sh"), "-c", f"echo ready; exec {sleep} infinity"]
        if image.resolv is not None:
            argv += ["--ro-bind", str(image.resolv), "/etc/resolv.conf"]
        argv += ["--ro-bind", str(image.kit), image.kit_at, "--chdir", "/", "--clearenv", "--", *keeper]
        if image.holder is not None:
            argv = inside_argv(image.holder, argv)
    if uid is not None:
        argv = [host_tool("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *argv]
    if mount_namespace is not None:  # entered as root, before the uid changes
        argv = [host_tool("nsenter"), f"--mount={mount_namespace}", "--", *argv]
    return argv


# Runs the rest of its arguments holding two descriptors: the user namespace that owns the keeper
# $pid's other namespaces, and the keeper's own (bubblewrap's --disable-userns puts the keeper one
# user namespace below the other, where an unprivileged user holds no capability over the keeper's
# other namespaces; root needs neither: nsenter enters the user namespace last). In the first
# $count arguments (never the command's own), {owner} and {own} become their /proc/self/fd/N paths
# and {close} the shell redirections that close both before the command runs. 0xb701 is
# NS_GET_USERNS, F_SETFD is 2.
_OWNER = r"""
my ($pid, $count) = splice(@ARGV, 0, 2);
sub fail { print STDERR "termgym: cannot enter the sandbox: $_[0]: $!\n"; exit 125 }
sub held { my ($fd) = @_; open(my $handle, "<&=", $fd) or fail("hold $fd"); fcntl($handle, 2, 0) or fail("pass $fd on"); $handle }
open(my $ipc, "<", "/proc/$pid/ns/ipc") or fail("open its namespaces");
my $owner = ioctl($ipc, 0xb701, 0);
defined $owner or fail("find the user namespace owning them");
$owner += 0;
my $owner_handle = held($owner);
open(my $own, "<", "/proc/$pid/ns/user") or fail("open its user namespace");
my $own_handle = held(fileno($own));
my $own_fd = fileno($own);
for (@ARGV[0 .. $count - 1]) {
    s{\{owner\}}{/proc/self/fd/$owner}g;
    s{\{own\}}{/proc/self/fd/$own_fd}g;
    s{\{close\}}{$owner<&- $own_fd<&-}g;
}
exec { $ARGV[0] } @ARGV;
fail("run $ARGV[0]");
"""


def enter_argv(
    keeper_pid: int,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    *,
    kit_at: str | None = None,
    privileged: bool = True,
) -> list[str]:
    """``argv`` run in the namespaces of the keeper ``keeper_pid`` (all of them, its root and
    working directory too) as the sandbox's root, with ``COMMAND_CAPABILITIES`` only, in ``cwd``,
    with exactly ``env``; ``setpriv`` and ``env`` are the host's (from the kit at ``kit_at`` in a
    sandbox over an image). Not ``privileged`` (termgym not root): through the user namespace that
    owns the keeper's other namespaces first, then the keeper's own. To be run ``within_limits``."""
    pairs = [f"{key}={value}" for key, value in env.items()]
    capabilities = ",".join(f"+{name}" for name in COMMAND_CAPABILITIES)
    namespaces = ["-m", "-p", "-n", "-i", "-u", "-r", "-w"]
    if privileged:
        enter = [host_tool("nsenter"), "-t", str(keeper_pid), "-U", *namespaces, "--"]
    else:
        inner, sh = [host_tool("nsenter")], ["/bin/sh"]
        if kit_at is not None:
            inner, sh = kit_argv(kit_at, "nsenter"), kit_argv(kit_at, "sh")
        keep = "--preserve-credentials"  # an unprivileged user namespace refuses setgroups
        enter = [host_tool("nsenter"), keep, "-t", str(keeper_pid), "--user={owner}", *namespaces, "--"]
        enter += [*inner, keep, "--user={own}", "--", *sh, "-c", 'exec {close}; exec "$@"', "sh"]
        enter = [host_tool("perl"), "-e", _OWNER, str(keeper_pid), str(len(enter)), *enter]
    if kit_at is None:
        setpriv, run_env = [host_tool("setpriv")], ["/usr/bin/env"]
    else:
        setpriv, run_env = kit_argv(kit_at, "setpriv"), kit_argv(kit_at, "env")
    drop = [*setpriv, "--inh-caps=-all", f"--bounding-set=-all,{capabilities}", "--"]
    return [*enter, *drop, *run_env, "-i", "-C", cwd, *pairs, *argv]


def within_limits(argv: list[str], procs_files: Sequence[str], file_size_limit: int | None) -> list[str]:
    """``argv`` run in the cgroups whose ``cgroup.procs`` files are ``procs_files``, under the
    per-file size limit (bytes; None: none), with descriptors 0, 1 and 2 only (whatever else the
    process that starts it left open), with no_new_privs and refused the system calls
    ``syscall_filter`` refuses, all from its first instruction. Every host command of a sandbox
    (its keeper, each command entered) is run so."""
    if file_size_limit is not None:
        argv = [host_tool("prlimit"), f"--fsize={file_size_limit}", "--", *argv]
    machine = this_machine()
    numbers = [str(n) for n in (machine.prctl, machine.seccomp, machine.close_range)]
    return [host_tool("perl"), "-e", _GUARD, *numbers, program(machine).hex(), *procs_files, "--", *argv]
