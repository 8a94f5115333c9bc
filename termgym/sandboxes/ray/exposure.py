"""Whether a sandbox with network on this host could reach Ray: the Ray processes' listening TCP
sockets on an address other than loopback (``exposed_ray_listeners``).

Ray's API is unauthenticated: whoever reaches its GCS, a raylet, a worker or the Ray Client server
can run code on the node (the "ShadowRay" class of attack). Ray 2.60 binds its GCS and raylets to
every interface whatever ``--node-ip-address`` says, and a container on the Docker bridge reaches
the host's every address (the bridge's gateway, the host's own addresses) unless a firewall rule
drops that traffic. Loopback alone is out of a container's reach. So a Ray process listening on any
other address is taken as reachable from the bridge, unless the operator says the bridge is
firewalled from Ray's ports (``TERMGYM_RAY_PORTS_FIREWALLED=1``; docs/guides/cluster.md).

What it covers: the processes of this host whose command is Ray's (its GCS, raylet, its Python
services and ``ray::`` workers) and whose descriptors this process may read (the user's own, or all
when root). Not covered: whether a firewall rule is in place (reading it needs privileges).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from pathlib import Path

FIREWALLED_VARIABLE = "TERMGYM_RAY_PORTS_FIREWALLED"
LISTEN = "0A"  # the TCP state column of /proc/net/tcp
# A process is Ray's when its command is one of Ray's binaries, a ray:: worker, or a Python module of Ray's.
RAY_BINARIES = ("gcs_server", "raylet")
RAY_MODULES = ("/ray/_private/", "/ray/dashboard/", "/ray/autoscaler/", "ray.util.client.server", "/ray/util/client/")


def parse_listeners(table: str) -> list[tuple[str, int, int]]:
    """The listening sockets of a ``/proc/net/tcp`` or ``/proc/net/tcp6`` table: (address, port, inode)."""
    found = []
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        hex_address, _, hex_port = fields[1].partition(":")
        raw = bytes.fromhex(hex_address)
        # the kernel prints each 32-bit word in host byte order (little-endian here)
        words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
        address = str(ipaddress.ip_address(words))
        found.append((address, int(hex_port, 16), int(fields[9])))
    return found


def is_loopback(address: str) -> bool:
    """Whether only this host's own processes can reach ``address`` (an IPv4-mapped one included)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


def ray_command(argv: list[str]) -> str | None:
    """The name of a Ray process (its binary, its ``ray::`` title, or its Python module's file) from
    its command line (``/proc/<pid>/cmdline``, split at NUL); None for a process that is not Ray's."""
    if not argv or not argv[0]:
        return None
    if argv[0].startswith("ray::"):
        return argv[0].split()[0]
    if os.path.basename(argv[0]) in RAY_BINARIES:
        return os.path.basename(argv[0])
    for arg in argv[1:3]:
        if any(marker in arg for marker in RAY_MODULES):
            return os.path.basename(arg)
    return None


def shown(address: str, port: int) -> str:
    """``ADDRESS:PORT``, an IPv4-mapped address as IPv4, an IPv6 one in brackets."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def exposed_ray_listeners(proc: Path = Path("/proc")) -> list[str]:
    """``ADDRESS:PORT (command)`` for each listening socket of a Ray process on this host whose
    address is not loopback, sorted; empty when none (or none this process may see)."""
    owners: dict[int, str] = {}
    for pid_dir in proc.glob("[0-9]*"):
        try:
            argv = (pid_dir / "cmdline").read_bytes().decode(errors="replace").split("\0")
            name = ray_command(argv)
            if name is None:
                continue
            for fd in (pid_dir / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:["):
                        owners[int(target[8:-1])] = name
        except OSError:  # it ended meanwhile, or it is not ours to read
            continue
    exposed = set()
    for table in ("tcp", "tcp6"):
        with contextlib.suppress(OSError):
            for address, port, inode in parse_listeners((proc / "net" / table).read_text()):
                if inode in owners and not is_loopback(address):
                    exposed.add(f"{shown(address, port)} ({owners[inode]})")
    return sorted(exposed)
