"""The command lines the embedded backend runs on the host: the keeper that holds a sandbox's
namespaces, the way every command enters them, and the limits and the guard both start under.

Pure: argv lists in, argv lists out. Every host program is found by absolute path
(``termgym.sandboxes.tools.host_tool``); what runs inside the sandbox is named by its path there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from termgym.sandboxes.host_kit import kit_argv
from termgym.sandboxes.local.holder import inside_argv
from termgym.sandboxes.local.host import bwrap_supports, keeper_is_init
from termgym.sandboxes.local.syscall_filter import program, this_machine
from termgym.sandboxes.tools import host_tool

# Docker's default capability set: what root in a container may do, without mounts, tracing,
# module loading or raw devices. Commands entered into the sandbox keep only these.
COMMAND_CAPABILITIES = tuple(
    "chown dac_override fowner fsetid kill setgid setuid setpcap net_bind_service net_raw sys_chroot mknod"
    " audit_write setfcap".split()
)
SHM_BYTES = 64 << 20
# Their numbers (<linux/capability.h>), which the guard keeps in the bounding set of what it enters.
CAPABILITY_NUMBERS = {
    "chown": 0, "dac_override": 1, "fowner": 3, "fsetid": 4, "kill": 5, "setgid": 6, "setuid": 7, "setpcap": 8,
    "net_bind_service": 10, "net_raw": 13, "sys_chroot": 18, "mknod": 27, "audit_write": 29, "setfcap": 31,
}  # fmt: skip
# The guard every host command of a sandbox starts with (perl-base is Essential on Debian). Before
# "--" it reads directives: cgroup=FILE (join that cgroup: 0, itself, written to FILE, one of
# ``SandboxCgroup.join_files``), fsize=BYTES (the per-file size limit, as prlimit sets it), for a
# keeper mount=FILE (enter that mount namespace, as ``nsenter --mount``) and uid=UID (become that
# user, as ``setpriv --reuid --regid --clear-groups``), and for a command entered as root enter=PID,
# cwd=DIR, caps=N,N..., as=UID:GID:GROUPS, deadline=SECONDS and env=COUNT followed by that many
# KEY=VALUE words. It joins the cgroups, closes every descriptor but
# 0, 1 and 2 (close_range), sets the size limit, no_new_privs and the seccomp program
# (``syscall_filter``): a process is in the sandbox's cgroups and under its filter before it starts,
# so nothing it forks escapes them, and it holds no descriptor of this process, whatever spawned it
# (uvloop's subprocess_exec ignores close_fds). Then mount and uid (with users=COUNT also a user
# namespace of its own, ids 0..COUNT-1 mapped to UID.. by a child still root, where it forbids
# further user namespaces: a keeper whose sandbox runs an image's USER). With enter=PID it does what
# ``nsenter -t PID -U -m -p -n -i -u -r`` followed by ``setpriv --inh-caps=-all
# --bounding-set=-all,+CAPS`` and ``env -i -C DIR VARS`` did, in one process instead of four
# programs (each exec costs about half a bubblewrap spawn): opens the keeper's namespaces and root
# while it still sees the host's /proc and forks into the PID namespace. The parent stays in the
# host's other namespaces and root, waits and ends as its child did (as nsenter's parent does,
# though that one waits inside the sandbox's other namespaces). The child enters every other
# namespace, the user one last (the others belong to its parent), takes the keeper's root, becomes
# the namespace's root, drops every capability but CAPS from its bounding set, clears its
# inheritable (so its ambient) set, with as=UID:GID:GROUPS becomes that user, and runs the command
# with exactly VARS in DIR. With deadline=SECONDS it also does what ``timeout -k 1 SECONDS`` did,
# without that program's two execs: the child leads a process group of its own; at the deadline the
# parent sends that group TERM and CONT, one second later KILL, and exits 124 (137 where KILL ended
# the command), as timeout does. No host tool loads a seccomp program in front of a command
# (util-linux 2.38 has neither enosys nor setpriv --seccomp-filter; bwrap's --seccomp reaches only
# the keeper), and a Python preexec_fn would fork the whole termgym process for every command
# instead of vfork (17 ms at 500 MB). Its first arguments: the numbers of the calls it makes
# (``Machine.guard_numbers``) and the program in hex.
_GUARD_HEAD = r"""
my ($numbers, $filter) = splice(@ARGV, 0, 2);
my ($prctl, $seccomp, $close_range, $setns, $setgroups, $setresuid, $setresgid, $capget, $capset, $prlimit,
    $unshare, $setitimer) = map { $_ + 0 } split(/,/, $numbers);
sub fail { print STDERR "termgym: the sandbox guard could not $_[0]: $!\n"; exit 125 }
my (%set, @env);
while (@ARGV) {
    my $arg = shift @ARGV;
    last if $arg eq "--";
    my ($key, $value) = split(/=/, $arg, 2);
    if ($key eq "cgroup") {
        open(my $procs, ">", $value) or fail("join the cgroup $value");
        print $procs "0\n" and close $procs or fail("join the cgroup $value");
    } elsif ($key eq "env") {
        @env = splice(@ARGV, 0, $value);
    } else {
        $set{$key} = $value;
    }
}
syscall($close_range, 3, 0xFFFFFFFF, 0) == 0 or fail("close the descriptors it inherited");
if (defined $set{fsize}) {
    my $limit = pack("QQ", $set{fsize}, $set{fsize});
    syscall($prlimit, 0, 1, $limit, 0) == 0 or fail("limit the size of a file");
}
syscall($prctl, 38, 1, 0, 0, 0) == 0 or fail("set no_new_privs");
my $program = pack("H*", $filter);
my $fprog = pack("S x![p] p", length($program) / 8, $program);
syscall($seccomp, 1, 0, $fprog) == 0 or fail("install the seccomp filter");
if (defined $set{mount}) {
    open(my $namespace, "<", $set{mount}) or fail("open the sandbox's mount namespace");
    syscall($setns, fileno($namespace), 0x20000) == 0 or fail("enter the sandbox's mount namespace");
    close($namespace);
}
if (defined $set{uid}) {
    my $id = $set{uid} + 0;
    my ($child, $go_reader, $go, $mapped, $mapped_writer);
    if (defined $set{users}) {  # a child still root maps ids 0..users-1 to $id.. once this process unshared
        pipe($go_reader, $go) && pipe($mapped, $mapped_writer) or fail("make a pipe");
        my $parent = $$;
        $child = fork();
        defined $child or fail("fork the user namespace's mapper");
        if ($child == 0) {
            close($go);
            sysread($go_reader, my $byte, 1) == 1 or exit 1;
            for my $map ("uid_map", "gid_map") {
                my $file;
                open($file, ">", "/proc/$parent/$map") && syswrite($file, "0 $id $set{users}\n") or exit 1;
                close($file) or exit 1;
            }
            syswrite($mapped_writer, "1") == 1 or exit 1;
            exit 0;
        }
        close($go_reader);
        close($mapped_writer);
    }
    syscall($setgroups, 0, 0) == 0 or fail("clear its groups");
    syscall($setresgid, $id, $id, $id) == 0 or fail("take the group $id");
    syscall($setresuid, $id, $id, $id) == 0 or fail("become the user $id");
    if (defined $child) {  # owned by $id, as bubblewrap's own would be; its root is $id, the next ids its users
        syscall($unshare, 0x10000000) == 0 or fail("make the sandbox's user namespace");
        syswrite($go, "1") == 1 or fail("start the user namespace's mapper");
        my $done = sysread($mapped, my $byte, 1);
        waitpid($child, 0);
        $done == 1 or fail("map the users of the sandbox's user namespace");
        my $limit;
        open($limit, ">", "/proc/sys/user/max_user_namespaces") && syswrite($limit, "0") && close($limit)
            or fail("forbid user namespaces inside the sandbox's");
    }
}
"""
# The entry, as root (enter=PID): only the guard of an entered command compiles it (perl compiles a
# script on every start: about 0.8 ms for this part).
_GUARD_ENTER = r"""
if (defined $set{enter}) {
    my $pid = $set{enter};
    my %ns;
    for my $kind (qw(ipc uts net pid mnt user)) {
        open($ns{$kind}, "<", "/proc/$pid/ns/$kind") or fail("open the sandbox's $kind namespace");
    }
    opendir(my $root, "/proc/$pid/root") or fail("open the sandbox's root");
    open(my $last_file, "<", "/proc/sys/kernel/cap_last_cap") or fail("read the last capability");
    my $last = <$last_file> + 0;
    syscall($setgroups, 0, 0) == 0 or fail("clear its groups");
    syscall($setns, fileno($ns{pid}), 0) == 0 or fail("enter the sandbox's pid namespace");  # its child's
    my $child = fork();
    defined $child or fail("fork into the sandbox's namespaces");
    if ($child) {  # stays in the host's other namespaces and root: waits, then ends as its command did
        close($_) for values %ns;
        closedir($root);
        my $late = 0;
        if (defined $set{deadline}) {  # as timeout -k 1 DEADLINE: its group TERMed (and CONTed), KILLed 1 s later
            setpgrp($child, $child);  # the child does so too: whichever runs first
            my $arm = sub {
                my $left = shift;
                my $value = pack("l!4", 0, 0, int($left), int(($left - int($left)) * 1e6));
                syscall($setitimer, 0, $value, 0) == 0 or fail("set the command's deadline");
            };
            $SIG{ALRM} = sub {
                if ($late++) {
                    kill("KILL", -$child);
                } else {
                    kill("TERM", -$child);
                    kill("CONT", -$child);
                    $arm->(1);
                }
            };
            $arm->($set{deadline} > 0.001 ? $set{deadline} : 0.001);
        }
        waitpid($child, 0) == $child or fail("wait for its command");
        $SIG{ALRM} = "IGNORE";  # reaped: its pid no longer names a group of this command's
        my $signal = $? & 127;
        exit($signal == 9 ? 137 : 124) if $late;  # timeout(1)'s statuses
        if ($signal) {
            $SIG{$_} = "DEFAULT" for keys %SIG;
            kill($signal, $$);
        }
        exit($? >> 8);
    }
    setpgrp(0, 0) if defined $set{deadline};
    for my $kind (qw(ipc uts net mnt user)) {
        syscall($setns, fileno($ns{$kind}), 0) == 0 or fail("enter the sandbox's $kind namespace");
    }
    chdir($root) or fail("reach the sandbox's root");
    chroot(".") or fail("take the sandbox's root");
    syscall($setgroups, 0, 0);  # refused where the namespace denies it: cleared above
    syscall($setresgid, 0, 0, 0) == 0 or fail("become the sandbox's root group");
    syscall($setresuid, 0, 0, 0) == 0 or fail("become the sandbox's root");
    close($_) for values %ns;
    closedir($root);
    my %keep = map { $_ => 1 } split(/,/, $set{caps});
    for my $cap (0 .. $last) {
        next if $keep{$cap};
        syscall($prctl, 24, $cap, 0, 0, 0) == 0 or fail("drop capability $cap");
    }
    my $header = pack("LL", 0x20080522, 0);
    my $sets = "\0" x 24;
    syscall($capget, $header, $sets) == 0 or fail("read its capabilities");
    my @words = unpack("L6", $sets);
    @words[2, 5] = (0, 0);
    syscall($capset, $header, pack("L6", @words)) == 0 or fail("clear its inheritable capabilities");
    if (defined $set{as}) {  # the image's USER: its groups, group and user (which ends its capabilities)
        my ($uid, $gid, @groups) = map { $_ + 0 } split(/[:,]/, $set{as});
        my $list = @groups ? pack("L*", @groups) : 0;
        syscall($setgroups, scalar(@groups), $list) == 0 or fail("take the groups of user $uid");
        syscall($setresgid, $gid, $gid, $gid) == 0 or fail("take the group $gid");
        syscall($setresuid, $uid, $uid, $uid) == 0 or fail("become the user $uid");
    }
    %ENV = map { split(/=/, $_, 2) } @env;
    unless (chdir($set{cwd})) {
        print STDERR "termgym: cannot change directory to '$set{cwd}': $!\n";
        exit 125;
    }
    exec { $ARGV[0] } @ARGV;
    print STDERR "termgym: cannot run $ARGV[0]: $!\n";
    exit($! + 0 == 2 ? 127 : 126);  # ENOENT; not %!, which loads the Errno module (3 ms)
}
"""
_GUARD_EXEC = r"""
exec { $ARGV[0] } @ARGV;
fail("run $ARGV[0]");
"""
_GUARD = _GUARD_HEAD + _GUARD_EXEC
_GUARD_ENTERING = _GUARD_HEAD + _GUARD_ENTER + _GUARD_EXEC
GUARD_SCRIPTS = (_GUARD, _GUARD_ENTERING)  # what a guard process runs (``perl -e SCRIPT``)
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


def _sandbox_tool(name: str) -> list[str]:
    """The host's program ``name`` as a sandbox over the host's system sees it (its ``/usr``)."""
    return [f"/usr/bin/{name}" if name == "env" else f"/bin/{name}"]


def keeper_command(tool: Callable[[str], list[str]]) -> list[str]:
    """The keeper, from the programs ``tool(name)`` runs (the host's, or the kit's over an image): it
    says "ready" once the sandbox is set up, then sleeps; commands enter its namespaces. As the PID
    namespace's init (``host.keeper_is_init``) it ignores SIGCHLD across its exec (``env
    --ignore-signal``), so the kernel reaps every orphan it adopts, and no process of the sandbox can
    signal it (the kernel drops what they send an init that has no handler: ``kill -9 -1`` spares
    it); only the host ends it, and with it the namespace."""
    sleep = [*tool("sleep"), "infinity"]
    if keeper_is_init():
        sleep = [*tool("env"), "--ignore-signal=CHLD", *sleep]
    return [*tool("sh"), "-c", f"echo ready; exec {' '.join(sleep)}"]


def keeper_argv(
    files_dir: Path,
    roots: Sequence[str],
    *,
    detached: bool = False,
    image: ImageRoot | None = None,
    mapped: bool = False,
) -> list[str]:
    """bubblewrap's command line for a sandbox whose writable roots are ``files_dir/<root>`` over
    the host's read-only ``/usr`` and ``/etc`` (or, with ``image``, whose root is that image's);
    ``detached`` (a kept sandbox): without ``--die-with-parent``. To be run ``within_limits``, as
    the sandbox's host user and in its own mount namespace where it has them (``uid`` and
    ``mount_namespace`` there; ``termgym.sandboxes.local.namespace``). ``mapped``: started in the
    user namespace of many ids the guard made (``within_limits``' ``users``), which it keeps, where
    the guard forbade further user namespaces; bubblewrap, its root, gives its command every
    capability there, which ``setpriv`` drops, bounding set too, before the keeper runs."""
    if mapped:
        userns: tuple[str, ...] = ("--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts")
        userns += ("--unshare-cgroup-try", "--assert-userns-disabled")
    else:
        disable = ("--disable-userns",) if bwrap_supports("--disable-userns") else ()
        userns = ("--unshare-all", "--unshare-user", *disable, "--uid", "0", "--gid", "0")
    options = [
        userns,
        ("--hostname", "termgym"),
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
    kit_at = image.kit_at if image is not None else None
    drop = [*(kit_argv(kit_at, "setpriv") if kit_at else [host_tool("setpriv")]), "--bounding-set=-all"]
    drop = [*drop, "--inh-caps=-all", "--"] if mapped else []
    keeper = keeper_command((lambda name: kit_argv(kit_at, name)) if kit_at is not None else _sandbox_tool)
    if keeper_is_init():
        argv.append("--as-pid-1")
    if image is None:
        for name in roots:
            argv += ["--bind", str(files_dir / name), f"/{name}"]
        argv += ["--remount-ro", "/", "--chdir", "/", "--clearenv", "--", *drop, *keeper]
    else:
        if image.resolv is not None:
            argv += ["--ro-bind", str(image.resolv), "/etc/resolv.conf"]
        argv += ["--ro-bind", str(image.kit), image.kit_at, "--chdir", "/", "--clearenv", "--", *drop, *keeper]
        if image.holder is not None:
            argv = inside_argv(image.holder, argv)
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
sub held {
    my ($fd) = @_;
    open(my $handle, "<&=", $fd) or fail("hold $fd");
    fcntl($handle, 2, 0) or fail("pass $fd on");
    $handle
}
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


@dataclass(frozen=True)
class RunAs:
    """A user of the sandbox's user namespace (the image's ``USER``, resolved by ``users``): its uid, its
    group and its supplementary groups, as the sandbox sees them."""

    uid: int
    gid: int
    groups: tuple[int, ...] = ()


@dataclass(frozen=True)
class RootEntry:
    """A command entered as root into the namespaces of the keeper ``keeper_pid`` (all of them, its
    root too), as the sandbox's root with ``COMMAND_CAPABILITIES`` only, in ``cwd``, with exactly
    ``env``: done by the guard itself (``within_limits``)."""

    keeper_pid: int
    cwd: str
    env: Mapping[str, str]
    user: RunAs | None = None  # then as that user instead, its capabilities gone
    deadline: float | None = None  # seconds: then ended as ``timeout -k 1 DEADLINE`` ends its command

    def directives(self) -> list[str]:
        pairs = [f"{key}={value}" for key, value in self.env.items()]
        caps = ",".join(str(CAPABILITY_NUMBERS[name]) for name in COMMAND_CAPABILITIES)
        run_as = [f"as={self.user.uid}:{self.user.gid}:{','.join(map(str, self.user.groups))}"] if self.user else []
        deadline = [f"deadline={self.deadline:.3f}"] if self.deadline is not None else []
        entry = [f"enter={self.keeper_pid}", f"cwd={self.cwd}", f"caps={caps}", *run_as, *deadline]
        return [*entry, f"env={len(pairs)}", *pairs]


def enter_argv(
    keeper_pid: int,
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: str,
    *,
    kit_at: str | None = None,
    privileged: bool = False,
    user: RunAs | None = None,
) -> list[str]:
    """``argv`` run as a ``RootEntry`` is, through ``nsenter``, ``setpriv`` and ``env`` (the host's;
    inside, from the kit at ``kit_at`` in a sandbox over an image): ``privileged``, as root, for a
    long-lived command, whose waiting ``nsenter`` holds a fifth of the guard's memory, or without
    root where the keeper's user namespace is one this user made (``holder``'s, mapped); otherwise
    by a user that is not root, through the user namespace that owns the keeper's other namespaces
    first, then the keeper's own; as ``user`` where given (privileged). To be run ``within_limits``."""
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
    drop = [*setpriv, "--inh-caps=-all", f"--bounding-set=-all,{capabilities}"]
    if user is not None:  # privileged only (a user namespace of several ids)
        groups = f"--groups={','.join(map(str, user.groups))}" if user.groups else "--clear-groups"
        drop += [f"--reuid={user.uid}", f"--regid={user.gid}", groups]
    drop.append("--")
    return [*enter, *drop, *run_env, "-i", "-C", cwd, *pairs, *argv]


def within_limits(
    argv: list[str],
    join_files: Sequence[str],
    file_size_limit: int | None,
    entry: RootEntry | None = None,
    *,
    mount_namespace: str | None = None,
    uid: int | None = None,
    users: int | None = None,
) -> list[str]:
    """``argv`` run in the cgroups whose ``SandboxCgroup.join_files`` are ``join_files``, under the
    per-file size limit (bytes; None: none), with descriptors 0, 1 and 2 only (whatever else the
    process that starts it left open), with no_new_privs and refused the system calls
    ``syscall_filter`` refuses, all from its first instruction; then in the mount namespace
    ``mount_namespace`` (a file, as root) and as the host user ``uid`` (both: a keeper's start);
    with ``entry``, entered into a sandbox as root (``argv`` is then named as the sandbox sees
    it). Every host command of a sandbox (its keeper, each command entered) is run so."""
    directives = [f"cgroup={path}" for path in join_files]
    if file_size_limit is not None:
        directives.append(f"fsize={file_size_limit}")
    if mount_namespace is not None:
        directives.append(f"mount={mount_namespace}")
    if uid is not None:
        directives.append(f"uid={uid}")
    if users is not None:  # with uid: in a user namespace of its own mapping 0..users-1 to uid..
        directives.append(f"users={users}")
    if entry is not None:
        directives += entry.directives()
    machine = this_machine()
    script = _GUARD if entry is None else _GUARD_ENTERING
    return [host_tool("perl"), "-e", script, machine.guard_numbers(), program(machine).hex(), *directives, "--", *argv]
