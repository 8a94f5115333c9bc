"""User-mode network for an embedded sandbox whose task asks for it: ``pasta`` (Debian ``passt``)
attached to the keeper's network namespace, and taken away again.

Guarantees: the sandbox reaches every address that is not the host's own (TCP, UDP, ICMP echo),
and never the host's loopback, the host's own addresses (as listed at each attach) or the host's
ports by any forwarding. The nftables ruleset that drops those is loaded in the sandbox's network
namespace before ``pasta`` brings the device up, and nothing in the sandbox can change it (no
``CAP_NET_ADMIN`` over the namespace). ``pasta`` never outlives the keeper it serves. Needs Linux
5.16 or later and ``nft``; where either is missing the sandbox gets no network and the record says
why.

Design, what is reachable and how: docs/guides/backends.md#network-embedded."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import signal
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from termgym.aio import wait_for
from termgym.errors import BackendUnavailable, SandboxError
from termgym.sandboxes.host_processes import POLL_SEC, alive, children, exited, kill_tree, release, spawn, start_time
from termgym.sandboxes.local.commands import within_limits
from termgym.sandboxes.tools import PACKAGES, TRUSTED_DIRS, host_tool

DEVICE = "eth0"
START_TIMEOUT = 10.0
# What each host program the network needs comes in (Debian).
TOOLS = ("pasta", "nft", "ip")
PASTA_OPTIONS = (
    *("--ns-ifname", DEVICE),  # the device made beforehand, the rules already on it
    "--config-net",  # the host's address, route and MTU on it, and up
    "--no-map-gw",  # the gateway's address is the gateway, never the host's loopback
    *("--tcp-ports", "none", "--udp-ports", "none"),  # no host port forwarded into the sandbox
    *("--tcp-ns", "none", "--udp-ns", "none"),  # nor the sandbox's loopback ports to the host's (default: all)
)
# Destinations that are the host whatever its interfaces: its loopback, "this host" (the kernel
# delivers 0.0.0.0 and :: locally), broadcast and multicast, IPv4-mapped IPv6.
HOST_ALWAYS = (
    "0.0.0.0/8",
    "127.0.0.0/8",
    "224.0.0.0/4",
    "255.255.255.255/32",
    "::/127",
    "::ffff:0.0.0.0/96",
)
NO_NETWORK = "the task asks for network; the embedded backend has none here ({why}; or use --backend docker)"
USERNS = "{userns}"  # replaced by the helper with its descriptor of the namespace's owning user namespace
# Runs the rest of its arguments with a descriptor of the user namespace that owns the network
# namespace of the process $keeper (bubblewrap's --disable-userns puts the keeper one user
# namespace below it, where no capability over the network namespace is left), named
# /proc/self/fd/N in place of {userns}; SIGKILLs it once that keeper has ended (its start time no
# longer $started), and exits with its status. Perl, as the guard (commands._GUARD): perl-base is
# Essential on Debian. 0xb701 is NS_GET_USERNS, F_SETFD is 2 (keeps the descriptor across exec).
_IN_NAMESPACE = r"""
my ($keeper, $started) = splice(@ARGV, 0, 2);
sub fail { print STDERR "termgym: the network helper could not $_[0]: $!\n"; exit 125 }
open(my $net, "<", "/proc/$keeper/ns/net") or fail("open the sandbox's network namespace");
my $owner = ioctl($net, 0xb701, 0);
defined $owner or fail("find the user namespace owning it");
$owner += 0;
open(my $pass, "<&=", $owner) or fail("hold that user namespace");
fcntl($pass, 2, 0) or fail("pass that user namespace on");
s{\{userns\}}{/proc/self/fd/$owner}g for @ARGV;
sub keeper_alive {
    open(my $stat, "<", "/proc/$keeper/stat") or return 0;
    my $line = <$stat>;
    $line =~ s/^.*\) //s;
    return (split / /, $line)[19] eq $started;
}
my $child = fork // fail("fork");
if ($child == 0) { exec { $ARGV[0] } @ARGV; fail("run $ARGV[0]") }
$SIG{ALRM} = sub { kill("KILL", $child) unless keeper_alive(); alarm 1 };
alarm 1;
waitpid($child, 0);
exit(($? & 127) ? 128 + ($? & 127) : $? >> 8);
"""
# Made in the namespace before pasta starts: the tap (down, no address) and the rules on it.
_PREPARE = '"$1" link delete "$3" 2>/dev/null; "$1" tuntap add dev "$3" mode tap && exec "$2" -f -'
# Left after pasta ended when the network is taken away: loopback only, as the sandbox started.
_REMOVE = '"$1" link delete "$3"; exec "$2" flush ruleset'


# -- pure: the host's addresses, the rules, the command lines ---------------------------------------


def host_addresses(ip_json: str) -> list[str]:
    """Every address of the host in ``ip -j address show``'s output: each interface's addresses
    and their broadcast addresses. ``ValueError`` when it is not that output."""
    found: list[str] = []
    for interface in json.loads(ip_json or "[]"):
        for info in interface.get("addr_info", []):
            found += [str(ipaddress.ip_address(info[key])) for key in ("local", "broadcast") if key in info]
    return found


def blocked_networks(addresses: Iterable[str]) -> tuple[list[str], list[str]]:
    """The IPv4 and IPv6 destinations no packet from the sandbox may have: ``HOST_ALWAYS`` and
    ``addresses`` (the host's), merged into the fewest non-overlapping networks (an nftables
    interval set refuses overlaps). An entry that is no address is ``ValueError``."""
    networks = [ipaddress.ip_network(item) for item in (*HOST_ALWAYS, *addresses)]
    v4 = ipaddress.collapse_addresses(n for n in networks if isinstance(n, ipaddress.IPv4Network))
    v6 = ipaddress.collapse_addresses(n for n in networks if isinstance(n, ipaddress.IPv6Network))
    return [str(n) for n in v4], [str(n) for n in v6]


def ruleset(addresses: Iterable[str], device: str = DEVICE) -> str:
    """The nftables ruleset of a sandbox's network namespace: nothing to the host (the module's
    docstring), refused in ``output``, dropped at ``device``'s egress; all else accepted."""
    v4, v6 = blocked_networks(addresses)
    sets = (
        f"\tset host4 {{ type ipv4_addr; flags interval; elements = {{ {', '.join(v4)} }}; }}\n"
        f"\tset host6 {{ type ipv6_addr; flags interval; elements = {{ {', '.join(v6)} }}; }}\n"
    )

    def rules(verdict: str) -> str:
        return (
            f"\t\tip daddr @host4 {verdict}\n"
            f"\t\tip6 daddr @host6 {verdict}\n"
            f"\t\tip6 daddr ff00::/8 meta l4proto != ipv6-icmp {verdict}\n"
        )

    return (
        "flush ruleset\n"
        f"table inet termgym {{\n{sets}"
        "\tchain output {\n\t\ttype filter hook output priority 0; policy accept;\n"
        '\t\toifname "lo" accept\n'
        f"{rules('reject with icmpx admin-prohibited')}\t}}\n}}\n"
        f"table netdev termgym {{\n{sets}"
        f'\tchain egress {{\n\t\ttype filter hook egress device "{device}" priority 0; policy accept;\n'
        f"{rules('drop')}\t}}\n}}\n"
    )


def pasta_argv(keeper: int, *, runas: int | None, pid_file: Path, log_file: Path) -> list[str]:
    """``pasta`` serving the network namespace of the keeper ``keeper`` (run by the helper, which
    names the owning user namespace), in the foreground, as the host uid ``runas`` (None: as this
    process's user), writing its pid to ``pid_file`` once the device is up."""
    argv = [host_tool("pasta"), "--foreground", "--quiet", "--log-file", str(log_file), "--pid", str(pid_file)]
    if runas is not None:
        argv += ["--runas", str(runas)]
    return [*argv, *PASTA_OPTIONS, "--userns", USERNS, str(keeper)]


def in_namespace_argv(keeper: int, started: int, argv: Sequence[str]) -> list[str]:
    """``argv`` run by the helper for the keeper ``keeper`` (started at ``started``), under the guard
    every host command of a sandbox starts with (``commands.within_limits``), in none of its cgroups."""
    return within_limits([host_tool("perl"), "-e", _IN_NAMESPACE, str(keeper), str(started), *argv], (), None)


def netns_argv(keeper: int, argv: Sequence[str]) -> list[str]:
    """``argv`` run in the network namespace of the keeper ``keeper`` with every capability over
    it (to be run ``in_namespace_argv``): the host's files, the namespace's network. As root, as
    the owning user namespace's root (the sandbox's uid; host root is no uid there, and an exec
    without one drops every capability); otherwise as this user, who is that root already (and
    may not call setgroups there)."""
    keep = ["--preserve-credentials"] if os.geteuid() != 0 else []
    enter = [host_tool("nsenter"), *keep, f"--user={USERNS}", f"--net=/proc/{keeper}/ns/net"]
    return [*enter, "--", *argv]


def missing_tool() -> str | None:
    """Why this host cannot give a sandbox network (a program missing or unsafe), or None."""
    for name in TOOLS:
        if not any(Path(directory, name).exists() for directory in TRUSTED_DIRS):
            return f"it needs {name}: apt-get install {PACKAGES[name]}"
        try:
            host_tool(name)
        except BackendUnavailable as exc:
            return str(exc)
    return None


# -- a sandbox's network ---------------------------------------------------------------------------


class SandboxNetwork:
    """The network of one sandbox, whose directory on the host is ``home`` and whose root is the
    host uid ``owner``: while ``wanted``, one ``pasta`` serving its current keeper."""

    def __init__(self, home: Path, owner: int) -> None:
        self._home = home
        self._owner = owner
        self.wanted = False
        self._helper: asyncio.subprocess.Process | None = None  # runs pasta
        self._keeper: int | None = None  # the keeper pasta serves

    @property
    def serving(self) -> int | None:
        """The keeper whose namespace has network now (None: none has)."""
        return self._keeper

    async def set(self, wanted: bool, keeper: int | None) -> str | None:
        """Network from now on (``wanted``) or none, for the keeper ``keeper`` (None: no keeper runs;
        the next one gets what was asked): None once that holds, else why not (one line, and
        nothing changed)."""
        if wanted and (why := missing_tool()) is not None:
            return NO_NETWORK.format(why=why)
        before, self.wanted = self.wanted, wanted
        try:
            await self.follow(keeper)
        except SandboxError as exc:
            self.wanted = before
            return NO_NETWORK.format(why=str(exc))
        return None

    async def follow(self, keeper: int | None) -> None:
        """What ``wanted`` says for the keeper ``keeper`` (the sandbox's keeper now; None: none
        runs): ``pasta`` attached to it, again when the keeper changed or ``pasta`` ended;
        ``SandboxError`` when it cannot be. Not wanted: none, and its device and rules removed."""
        running = self._helper is not None and self._helper.returncode is None
        if self.wanted and keeper is not None and (keeper != self._keeper or not running):
            await self.stop()
            await self._attach(keeper)
        elif not self.wanted and self._keeper is not None:
            served = self._keeper
            await self.stop()
            await self._remove(served)

    async def stop(self) -> None:
        """End ``pasta`` (its device stays, carrying nothing); ``wanted`` stays as it is."""
        helper, self._helper, self._keeper = self._helper, None, None
        if helper is not None:
            await end_helper(helper)

    async def _attach(self, keeper: int) -> None:
        started = start_time(keeper)
        if started is None:
            raise SandboxError("the sandbox's keeper is gone")
        listed = await _output([host_tool("ip"), "-j", "address", "show"])
        try:
            rules = ruleset(host_addresses(listed)).encode()
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise SandboxError(f"could not list the host's addresses: {exc}") from exc
        prepare = [host_tool("sh"), "-c", _PREPARE, "sh", host_tool("ip"), host_tool("nft"), DEVICE]
        try:
            await _output(in_namespace_argv(keeper, started, netns_argv(keeper, prepare)), stdin=rules)
        except SandboxError as exc:
            raise SandboxError(f"could not keep the host's services out of its reach: {exc}") from exc
        pid_file, log_file = self._home / "network.pid", self._home / "network.log"
        pid_file.write_bytes(b"")
        log_file.write_bytes(b"")
        if os.geteuid() == 0:
            os.chown(pid_file, self._owner, self._owner)  # pasta writes it once it runs as the owner
        runas = self._owner if os.geteuid() == 0 else None
        argv = in_namespace_argv(keeper, started, pasta_argv(keeper, runas=runas, pid_file=pid_file, log_file=log_file))
        with log_file.open("ab") as log:
            helper = await spawn(
                argv,
                end_helper,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        self._helper, self._keeper = helper, keeper
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while not pid_file.read_bytes():
                if helper.returncode is not None or time.monotonic() > deadline:
                    lines = log_file.read_text(errors="replace").strip().splitlines()
                    raise SandboxError(f"pasta did not start: {lines[-1] if lines else 'no reason given'}")
                await asyncio.sleep(POLL_SEC * 5)
        except BaseException:
            await self.stop()
            raise

    async def _remove(self, keeper: int) -> None:
        """The device and the rules out of the namespace of ``keeper``, if it still runs (best effort:
        with ``pasta`` ended the device carries nothing anyway)."""
        started = start_time(keeper)
        if started is None or not alive(keeper):
            return
        remove = [host_tool("sh"), "-c", _REMOVE, "sh", host_tool("ip"), host_tool("nft"), DEVICE]
        with contextlib.suppress(SandboxError):
            await _output(in_namespace_argv(keeper, started, netns_argv(keeper, remove)))


async def end_helper(helper: asyncio.subprocess.Process) -> None:
    """End ``pasta`` and its helper: ``pasta`` first, which the helper then reaps before it exits;
    both SIGKILLed where the helper has not exited within a second. Returns once it has."""
    if helper.returncode is None:
        for child in children(helper.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
        if not await exited(helper, 1.0):
            kill_tree(helper.pid)
    await release(helper)


async def _output(argv: Sequence[str], stdin: bytes | None = None, timeout: float = START_TIMEOUT) -> str:
    """What ``argv`` prints; ``SandboxError`` with the last line of its errors when it fails."""
    process = await spawn(
        argv,
        end_helper,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = await wait_for(process.communicate(stdin), timeout)
    except TimeoutError as exc:
        raise SandboxError(f"{Path(argv[0]).name} did not finish within {timeout:g}s") from exc
    finally:
        await end_helper(process)
    if process.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        raise SandboxError(lines[-1] if lines else f"exit status {process.returncode}")
    return out.decode(errors="replace")
