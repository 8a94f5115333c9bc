"""The embedded backend's network (``termgym.sandboxes.local.network``): a sandbox whose task asks
for network reaches a server outside the host, and nothing of the host's own (its loopback, its
addresses, a port mapped through the gateway), not even with frames written to its device; a
task without network, ``--network none`` and ``set_network(False)`` get none; the network follows
the keeper when it is replaced, and no ``pasta`` outlives the sandbox or its namespace.

The "outside" is a network namespace of its own joined to the host by a veth pair, on a /30 of the
benchmarking range (198.18.0.0/15) that no route of the host's covers, running ``python -m
http.server``; the host's services are listening sockets of this process, which count the
connections that reach them."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from termgym.episode.overrides import RunOverrides, apply_overrides
from termgym.episode.spec import sandbox_spec
from termgym.sandboxes.base import SandboxSpec
from termgym.sandboxes.host_processes import alive, start_time
from termgym.sandboxes.local import LocalSandbox
from termgym.sandboxes.local import network as network_module
from termgym.sandboxes.local.network import (
    PASTA_OPTIONS,
    blocked_networks,
    host_addresses,
    in_namespace_argv,
    netns_argv,
    pasta_argv,
    ruleset,
)
from termgym.tasks import load_task
from tests.helpers import REPO_ROOT, write_task
from tests.termgym.sandboxes.local.unprivileged import SYSTEM_PYTHON, nobody_home, run_as_nobody

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces and veth pairs need root")

# -- pure parts --------------------------------------------------------------------------------------

IP_JSON = json.dumps(
    [
        {"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1"}, {"family": "inet6", "local": "::1"}]},
        {
            "ifname": "eth0",
            "addr_info": [
                {"family": "inet", "local": "192.0.2.2", "prefixlen": 24, "broadcast": "192.0.2.255"},
                {"family": "inet6", "local": "fd00::2", "prefixlen": 64},
            ],
        },
        {"ifname": "docker0", "addr_info": []},
    ]
)


def test_host_addresses_are_every_local_and_broadcast_address():
    assert host_addresses(IP_JSON) == ["127.0.0.1", "::1", "192.0.2.2", "192.0.2.255", "fd00::2"]
    assert host_addresses("[]") == []
    with pytest.raises(ValueError, match="does not appear to be"):
        host_addresses('[{"addr_info": [{"local": "not an address"}]}]')


ALWAYS4 = ["0.0.0.0/8", "127.0.0.0/8", "224.0.0.0/4", "255.255.255.255/32"]
ALWAYS6 = ["::/127", "::ffff:0:0/96"]


@pytest.mark.parametrize(
    ("addresses", "v4", "v6"),
    [
        ([], ALWAYS4, ALWAYS6),
        (  # the host's loopback addresses are inside the loopback ranges: merged, never twice
            ["127.0.0.1", "::1", "192.0.2.2", "192.0.2.255", "fd00::2"],
            ["0.0.0.0/8", "127.0.0.0/8", "192.0.2.2/32", "192.0.2.255/32", "224.0.0.0/4", "255.255.255.255/32"],
            [*ALWAYS6, "fd00::2/128"],
        ),
        (  # adjacent addresses: one interval (an nftables interval set refuses overlaps)
            ["203.0.113.2", "203.0.113.3", "203.0.113.2"],
            ["0.0.0.0/8", "127.0.0.0/8", "203.0.113.2/31", "224.0.0.0/4", "255.255.255.255/32"],
            ALWAYS6,
        ),
    ],
)
def test_blocked_networks(addresses, v4, v6):
    assert blocked_networks(addresses) == (v4, v6)


def test_the_ruleset_blocks_the_host_at_the_devices_egress_and_in_output():
    rules = ruleset(["192.0.2.2", "fd00::2"])
    assert rules.startswith("flush ruleset\n")
    assert 'type filter hook egress device "eth0"' in rules and "type filter hook output" in rules
    assert rules.count("ip daddr @host4 drop") == 1 and rules.count("ip6 daddr @host6 drop") == 1
    assert rules.count("192.0.2.2/32") == 2 and rules.count("fd00::2/128") == 2  # one set per table
    assert 'oifname "lo" accept' in rules  # the sandbox's own services, over its own addresses


def test_pasta_maps_nothing_to_the_host():
    argv = pasta_argv(4242, runas=2000, pid_file=Path("/h/network.pid"), log_file=Path("/h/network.log"))
    assert argv[-1] == "4242" and argv[argv.index("--runas") + 1] == "2000"
    for option, value in [("--tcp-ports", "none"), ("--udp-ports", "none"), ("--tcp-ns", "none"), ("--udp-ns", "none")]:
        assert argv[argv.index(option) + 1] == value
    assert "--no-map-gw" in argv and "--config-net" in argv and set(PASTA_OPTIONS) <= set(argv)
    assert "--runas" not in pasta_argv(1, runas=None, pid_file=Path("/p"), log_file=Path("/l"))


# -- the outside, the host's services ------------------------------------------------------------------


@pytest.fixture(scope="session")
def network_tools() -> None:
    """pasta, nft, ip and curl, installed with scripts/apt-ensure.sh's ``apt_ensure`` when absent
    (a no-op when present; fails, never skips, when they cannot be installed)."""
    script = (
        f". {REPO_ROOT / 'scripts' / 'apt-ensure.sh'} && "
        'apt_ensure "network tests" pasta:passt nft:nftables ip:iproute2 curl:curl'
    )
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.fail(f"pasta and nft are needed and could not be installed: {result.stderr.strip()}")


@dataclass
class Outside:
    """A server outside the host: ``address``:``port`` in a namespace of its own, and a listener at
    ``address``:``COUNTER_PORT`` that writes a line to ``accepted`` for every connection it takes;
    ``host_side`` is the host's address on the veth pair (an address of the host, like its eth0's)."""

    namespace: str
    address: str
    host_side: str
    accepted: Path
    port: int = 8080

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}/"


COUNTER_PORT = 9000
COUNTER = (
    "import socket, sys\n"
    "listener = socket.create_server((sys.argv[1], int(sys.argv[2])))\n"
    "while True:\n"
    "    connection, _ = listener.accept()\n"
    "    with open(sys.argv[3], 'a') as log:\n"
    "        log.write('accepted\\n')\n"
    "    connection.close()\n"
)


def _ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def free_pair() -> tuple[str, str]:
    """Two addresses of a /30 of 198.18.0.0/15 that no route of the host's covers but the default
    (this machine's package registries answer on a test range of their own)."""
    routes = json.loads(_ip("-j", "route", "show", "table", "all"))
    taken = [ipaddress.ip_network(r["dst"], strict=False) for r in routes if r.get("dst", "default") != "default"]
    benchmarking = ipaddress.ip_network("198.18.0.0/15")
    while True:
        pick = ipaddress.ip_network((int(benchmarking.network_address) + 4 * random.randrange(1 << 15), 30))
        if not any(pick.overlaps(other) for other in taken if other.version == 4):
            return str(pick.network_address + 1), str(pick.network_address + 2)


@pytest.fixture
def outside(network_tools) -> Iterator[Outside]:
    tag = f"{os.getpid() % 100000}{random.randrange(100)}"
    namespace, veth = f"tg-out-{tag}", f"tgh{tag}"
    address, host_side = free_pair()
    www = Path(tempfile.mkdtemp(prefix="termgym-outside-"))
    (www / "index.html").write_text("hello from outside\n")
    www.chmod(0o755)
    servers: list[subprocess.Popen] = []
    try:
        _ip("netns", "add", namespace)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "tgo", "netns", namespace)
        _ip("addr", "add", f"{host_side}/30", "dev", veth)
        _ip("link", "set", veth, "up")
        _ip("-n", namespace, "addr", "add", f"{address}/30", "dev", "tgo")
        _ip("-n", namespace, "link", "set", "tgo", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")  # no default route: the host is on-link, nothing else is
        accepted = www / "accepted.log"
        for argv in (
            ["-m", "http.server", "8080", "--bind", address],
            ["-c", COUNTER, address, str(COUNTER_PORT), str(accepted)],
        ):
            inside = ["ip", "netns", "exec", namespace, sys.executable, *argv]
            servers.append(subprocess.Popen(inside, cwd=www, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection((address, 8080), timeout=1):
                break
            assert time.monotonic() < deadline, "the outside server did not start"
            time.sleep(0.05)
        yield Outside(namespace, address, host_side, accepted)
    finally:
        for server in servers:
            server.kill()
            server.wait()
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)
        subprocess.run(["ip", "link", "delete", veth], capture_output=True)
        for child in www.iterdir():
            child.unlink()
        www.rmdir()


class HostServer:
    """A service of the host's: a listening socket (``address``, any port) that counts the
    connections that reach it."""

    def __init__(self, address: str) -> None:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        if family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # "::" takes IPv4 too
        self.socket.bind((address, 0))
        self.socket.listen(64)
        self.socket.setblocking(False)
        self.port = self.socket.getsockname()[1]

    def reached(self) -> int:
        count = 0
        while True:
            try:
                connection, _ = self.socket.accept()
            except BlockingIOError:
                return count
            connection.close()
            count += 1

    def close(self) -> None:
        self.socket.close()


@pytest.fixture
def host_servers() -> Iterator[tuple[HostServer, HostServer]]:
    """A service on the host's loopback only, and one on every address of the host (``::``)."""
    loopback, everywhere = HostServer("127.0.0.1"), HostServer("::")
    yield loopback, everywhere
    loopback.close()
    everywhere.close()


# -- sandboxes ---------------------------------------------------------------------------------------


def network_task(root: Path, mode: str = "public"):
    task_dir = write_task(root, f"net-{mode}")
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text().replace('network_mode = "no-network"', f'network_mode = "{mode}"'))
    return load_task(task_dir)


async def sh(sandbox: LocalSandbox, script: str, timeout: float = 20) -> str:
    return (await sandbox.exec(["/bin/bash", "-c", script], timeout=timeout)).text


async def fetches(sandbox: LocalSandbox, outside: Outside) -> dict[str, str]:
    """The outside server's page, fetched from the sandbox three ways."""
    host, port = outside.address, outside.port
    python = f"import urllib.request; print(urllib.request.urlopen('{outside.url}', timeout=5).read().decode(), end='')"
    bash = f"exec 3<>/dev/tcp/{host}/{port}; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; tail -n 1 <&3"
    return {
        "curl": await sh(sandbox, f"curl -sS -m 5 {outside.url} 2>&1"),
        "python": await sh(sandbox, f'python3 -c "{python}" 2>&1'),
        "bash": await sh(sandbox, f"timeout 5 bash -c {_quote(bash)} 2>&1"),
    }


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


REACHED = {"curl": "hello from outside\n", "python": "hello from outside\n", "bash": "hello from outside\n"}


def serving(home: Path | None) -> list[int]:
    """Live host processes that serve the network of the sandbox in ``home``: the helper and pasta
    (their command lines name its pid file, which is the sandbox's own)."""
    assert home is not None
    return processes_naming(str(home / "network.pid"))


def processes_naming(text: str) -> list[int]:
    """Live host processes whose command line holds ``text``."""
    marker = text.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes() and alive(int(entry.name)):
                    found.append(int(entry.name))
    return found


def network_processes(sandbox: LocalSandbox) -> list[int]:
    return serving(sandbox.host_dir)


async def interfaces(sandbox: LocalSandbox) -> list[str]:
    return (await sh(sandbox, "ip -o link show | awk -F': ' '{print $2}'")).split()


@needs_root
async def test_a_task_with_network_reaches_a_server_outside_the_host(tmp_path, no_leaks, outside):
    spec = sandbox_spec(network_task(tmp_path), run_id="network-test")
    assert spec.network
    sandbox = LocalSandbox(spec)
    async with sandbox:
        assert not [w for w in sandbox.warnings if "network" in w]
        assert await fetches(sandbox, outside) == REACHED
        assert await interfaces(sandbox) == ["lo", "eth0"]
        assert "default via" in await sh(sandbox, "ip route")
        assert len(network_processes(sandbox)) == 2  # the helper and pasta
        home = sandbox.host_dir
    assert serving(home) == []


@needs_root
@pytest.mark.slow
async def test_nothing_of_the_hosts_own_is_reachable(no_leaks, outside, host_servers):
    """The host's loopback (directly, and through the gateway's address, which pasta would map to
    it), and every address of the host (its eth0's, which the sandbox holds a copy of, and the
    veth's, which it does not), refused from the sandbox: none of the host's services sees a
    connection, while the outside server stays reachable."""
    loopback, everywhere = host_servers
    listed = json.loads(_ip("-j", "address", "show"))
    own = [a["local"] for i in listed for a in i["addr_info"] if a.get("scope") == "global"]  # not lo's, not fe80::
    assert outside.host_side in own
    sandbox = LocalSandbox(SandboxSpec("net-host", None, None, network=True))
    async with sandbox:
        gateway = (await sh(sandbox, "ip route show default | awk '{print $3}'")).strip()
        assert gateway
        targets = [("127.0.0.1", loopback.port), ("localhost", loopback.port), (gateway, loopback.port)]
        targets += [(address, everywhere.port) for address in own]
        probe = "timeout 2 bash -c 'exec 3<>/dev/tcp/{0}/{1}' 2>/dev/null && echo {0}:open || echo {0}:closed"
        out = await sh(sandbox, "; ".join(probe.format(address, port) for address, port in targets))
        assert out.split() == [f"{address}:closed" for address, _ in targets]
        assert loopback.reached() == 0 and everywhere.reached() == 0
        assert await sh(sandbox, f"curl -sS -m 5 {outside.url}") == "hello from outside\n"


UNPRIVILEGED = textwrap.dedent(
    """
    import asyncio, json, site, sys
    site.addsitedir(sys.argv[1])
    from termgym.sandboxes.base import SandboxSpec
    from termgym.sandboxes.local import LocalSandbox

    async def main():
        sandbox = LocalSandbox(SandboxSpec("net-unprivileged", None, None, network=True))
        async with sandbox:
            ran = await sandbox.exec(["/bin/bash", "-c", sys.argv[2]], timeout=60)
            print(json.dumps({"output": ran.text, "warnings": sandbox.warnings}))

    asyncio.run(main())
    """
)


@needs_root
@pytest.mark.slow
@pytest.mark.skipif(not Path(SYSTEM_PYTHON).exists(), reason="Debian's python3.11 runs termgym as nobody")
def test_an_unprivileged_termgym_gives_the_network_and_nothing_of_the_hosts(outside, host_servers):
    """termgym itself as ``nobody`` (where its users often run: a GPU node without root): the
    sandbox reaches the outside server, and neither the host's loopback, nor its loopback through
    the gateway, nor any of its addresses; no process of the sandbox's network outlives it."""
    loopback, everywhere = host_servers
    listed = json.loads(_ip("-j", "address", "show"))
    own = [a["local"] for i in listed for a in i["addr_info"] if a.get("scope") == "global"]
    gateway = "$(ip route show default | awk '{print $3}')"
    targets = [("127.0.0.1", loopback.port), (gateway, loopback.port)]
    targets += [(address, everywhere.port) for address in own]
    probe = "timeout 2 bash -c 'exec 3<>/dev/tcp/{0}/{1}' 2>/dev/null && echo {1}@{0}:open || echo {1}@{0}:closed"
    fetch = f"exec 3<>/dev/tcp/{outside.address}/{outside.port}; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; tail -n 1 <&3"
    script = f"timeout 5 bash -c {_quote(fetch)}; " + "; ".join(probe.format(a, port) for a, port in targets)
    scratch = Path(tempfile.mkdtemp(prefix="termgym-test-net-unprivileged-", dir="/tmp"))
    try:
        home = nobody_home(scratch)
        report = run_as_nobody(UNPRIVILEGED, [script], home)
        lines = report["output"].splitlines()
        assert lines[0] == "hello from outside", report
        assert lines[1:] and all(line.endswith(":closed") for line in lines[1:]), report
        assert len(lines) == 1 + len(targets)
        assert loopback.reached() == 0 and everywhere.reached() == 0
        assert not [warning for warning in report["warnings"] if "network" in warning], report["warnings"]
        assert processes_naming(str(home)) == []  # pasta and the network helper ended with it
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)


RAW_SYN = textwrap.dedent(
    """
    import fcntl, socket, struct, sys

    def checksum(data):
        data += b"\\0" * (len(data) % 2)
        total = sum(struct.unpack(f"!{len(data) // 2}H", data))
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        return ~total & 0xFFFF

    probe = socket.socket()
    request = struct.pack("256s", b"eth0")
    mac = fcntl.ioctl(probe, 0x8927, request)[18:24]  # SIOCGIFHWADDR
    source = fcntl.ioctl(probe, 0x8915, request)[20:24]  # SIOCGIFADDR
    raw = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
    raw.bind(("eth0", 0))
    for target in sys.argv[1:]:
        address, port = target.rsplit(":", 1)
        destination = socket.inet_aton(address)
        tcp = struct.pack("!HHIIBBHHH", 40000, int(port), 1, 0, 5 << 4, 0x02, 65535, 0, 0)
        pseudo = source + destination + struct.pack("!BBH", 0, 6, len(tcp))
        tcp = tcp[:16] + struct.pack("!H", checksum(pseudo + tcp)) + tcp[18:]
        ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0, 64, 6, 0, source, destination)
        ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
        frame = b"\\xff" * 6 + mac + b"\\x08\\x00" + ip + tcp
        try:
            raw.send(frame)
            print(target, "sent")
        except OSError as exc:  # the egress hook's drop: ENOBUFS
            print(target, "refused", exc.errno)
    """
)


@needs_root
async def test_frames_written_to_the_device_never_reach_the_host(no_leaks, outside, host_servers):
    """Even a process with every capability over the sandbox's network namespace (as its commands
    would hold where bubblewrap lacks --disable-userns) writing TCP SYNs straight onto the device
    (a packet socket, past the IP stack's hooks) reaches none of the host's services; the same
    frame to the outside server does make pasta connect there (the probe works)."""
    loopback, everywhere = host_servers
    sandbox = LocalSandbox(SandboxSpec("net-raw", None, None, network=True))
    async with sandbox:
        keeper = sandbox._keeper_pid
        assert keeper is not None
        started = start_time(keeper)
        assert started is not None
        targets = [f"127.0.0.1:{loopback.port}", f"{outside.host_side}:{everywhere.port}", f"0.0.0.0:{loopback.port}"]
        argv = in_namespace_argv(keeper, started, netns_argv(keeper, ["/usr/bin/python3", "-c", RAW_SYN, *targets]))
        result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        assert all(line.endswith("refused 105") for line in result.stdout.splitlines()), result.stdout
        time.sleep(0.5)
        assert loopback.reached() == 0 and everywhere.reached() == 0
        control = [f"{outside.address}:{COUNTER_PORT}"]
        control_argv = in_namespace_argv(
            keeper, started, netns_argv(keeper, ["/usr/bin/python3", "-c", RAW_SYN, *control])
        )
        assert "sent" in subprocess.run(control_argv, capture_output=True, text=True, timeout=30, check=True).stdout
        deadline = time.monotonic() + 5
        while not (outside.accepted.exists() and outside.accepted.read_text()):
            assert time.monotonic() < deadline, "a raw SYN to the outside never made pasta connect"
            time.sleep(0.05)


@needs_root
async def test_a_task_without_network_gets_none(tmp_path, no_leaks, outside):
    spec = sandbox_spec(network_task(tmp_path, "no-network"), run_id="network-test")
    sandbox = LocalSandbox(spec)
    async with sandbox:
        assert await interfaces(sandbox) == ["lo"]
        assert "Couldn't connect" in await sh(sandbox, f"curl -sS -m 3 {outside.url} 2>&1")
        assert network_processes(sandbox) == []


@needs_root
async def test_network_none_withholds_it(tmp_path, no_leaks, outside):
    task, _, warnings = apply_overrides(network_task(tmp_path), RunOverrides(network="none"))
    assert warnings
    sandbox = LocalSandbox(sandbox_spec(task, run_id="network-test"))
    async with sandbox:
        assert await interfaces(sandbox) == ["lo"]
        assert "Couldn't connect" in await sh(sandbox, f"curl -sS -m 3 {outside.url} 2>&1")
        assert network_processes(sandbox) == []
        assert await sandbox.set_network(False) is None  # the verifier's phase: none either
        assert await interfaces(sandbox) == ["lo"]


@needs_root
async def test_set_network_takes_it_away_and_gives_it_back(no_leaks, outside):
    sandbox = LocalSandbox(SandboxSpec("net-switch", None, None, network=True))
    async with sandbox:
        assert await sh(sandbox, f"curl -sS -m 5 {outside.url}") == "hello from outside\n"
        assert await sandbox.set_network(False) is None
        assert network_processes(sandbox) == []
        assert await interfaces(sandbox) == ["lo"]  # as a sandbox without network starts
        assert "Couldn't connect" in await sh(sandbox, f"curl -sS -m 3 {outside.url} 2>&1")
        assert await sandbox.set_network(True) is None
        assert await sh(sandbox, f"curl -sS -m 5 {outside.url}") == "hello from outside\n"
    sandbox = LocalSandbox(SandboxSpec("net-later", None, None))  # the verifier's phase asks
    async with sandbox:
        assert await sandbox.set_network(True) is None
        assert await sh(sandbox, f"curl -sS -m 5 {outside.url}") == "hello from outside\n"


@needs_root
async def test_the_network_follows_the_keeper_and_ends_with_the_sandbox(no_leaks, outside):
    """After the kill step (the spare keeper takes over: a new namespace) and after a restarted
    keeper, the network is there again, served by one pasta only; after stop, none is left."""
    sandbox = LocalSandbox(SandboxSpec("net-kill", None, None, network=True))
    async with sandbox:
        first = set(network_processes(sandbox))
        assert len(first) == 2
        await sandbox.kill_agent_processes()  # the spare takes over
        assert not first & set(network_processes(sandbox))  # the old keeper's pasta ended with it
        assert await sh(sandbox, f"curl -sS -m 5 {outside.url}") == "hello from outside\n"
        second = set(network_processes(sandbox))
        assert len(second) == 2 and not first & second
        await sandbox.kill_agent_processes()  # no spare left: the next command starts a keeper
        assert await sh(sandbox, f"curl -sS -m 5 {outside.url}") == "hello from outside\n"
        assert len(network_processes(sandbox)) == 2
        home = sandbox.host_dir
    assert serving(home) == []


@needs_root
async def test_pasta_ends_with_the_namespace_it_serves(no_leaks, outside):
    """The keeper killed behind termgym's back (as when termgym dies: --die-with-parent): pasta and
    its helper end within a few seconds, nobody stopping them."""
    sandbox = LocalSandbox(SandboxSpec("net-die", None, None, network=True))
    async with sandbox:
        serving = network_processes(sandbox)
        assert len(serving) == 2
        keeper = sandbox._keeper
        assert keeper is not None and keeper.process is not None
        for init in [
            int(p) for p in Path(f"/proc/{keeper.process.pid}/task/{keeper.process.pid}/children").read_text().split()
        ]:
            os.kill(init, 9)
        deadline = time.monotonic() + 5
        while any(alive(pid) for pid in serving):
            assert time.monotonic() < deadline, "pasta outlived its namespace"
            time.sleep(0.05)


@needs_root
async def test_without_pasta_the_sandbox_has_no_network_and_says_why(no_leaks, monkeypatch, outside):
    monkeypatch.setattr(network_module, "TOOLS", ("pasta-not-installed",))
    monkeypatch.setitem(network_module.PACKAGES, "pasta-not-installed", "passt")
    sandbox = LocalSandbox(SandboxSpec("net-missing", None, None, network=True))
    async with sandbox:
        assert any("apt-get install passt" in line and "has none" in line for line in sandbox.warnings)
        assert await interfaces(sandbox) == ["lo"]
        assert network_processes(sandbox) == []
        assert (await sandbox.set_network(True)) in sandbox.warnings  # the same line: said once


@needs_root
@pytest.mark.docker
@pytest.mark.slow
async def test_over_a_task_image_the_network_and_the_hosts_resolver_are_there(tmp_path, no_leaks, outside):
    """A sandbox whose root is an image (the offline base, under another name, copied from the
    engine) gets the same network, and the host's resolver configuration in place of the image's
    own, as Docker writes one into every container; nothing of it is listed as the agent's."""
    from termgym.images.build import BASE_IMAGE
    from termgym.sandboxes.docker import docker_client
    from tests.helpers import require_docker

    require_docker()
    docker_client().api.tag(BASE_IMAGE, "termgym-test/network-image", "1")
    task = network_task(tmp_path)
    dockerfile = task.path / "environment" / "Dockerfile"
    dockerfile.write_text("FROM termgym-test/network-image:1\nWORKDIR /app\n")
    sandbox = LocalSandbox(sandbox_spec(load_task(task.path), run_id="network-test"))
    async with sandbox:
        assert sandbox.image["source"] == "build" and sandbox.image["ref"] == "termgym-test/network-image:1"
        reached = await sh(
            sandbox,
            f"exec 3<>/dev/tcp/{outside.address}/{outside.port}; printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3; tail -n 1 <&3",
        )
        assert reached == "hello from outside\n"
        assert await sh(sandbox, "cat /etc/resolv.conf") == Path("/etc/resolv.conf").read_text()
        assert " /etc/resolv.conf " in await sh(sandbox, "cat /proc/self/mountinfo")  # the host's, bound
        assert "/etc/resolv.conf" not in await sandbox.agent_changes()
