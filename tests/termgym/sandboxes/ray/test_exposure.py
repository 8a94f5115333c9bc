"""Ray's listeners a sandbox with network could reach (``termgym.sandboxes.ray.exposure``), and the
node's actor refusing a Docker sandbox network where they are (``SandboxHost.network_refusal``).
Pure parts on tables and a fake ``/proc``; the refusal on a real Docker sandbox, in this process."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import replace
from pathlib import Path

import pytest

from termgym.episode.options import EnvOptions
from termgym.sandboxes.ray.calls import SetNetwork
from termgym.sandboxes.ray.exposure import exposed_ray_listeners, is_loopback, parse_listeners, ray_command, shown
from termgym.sandboxes.ray.host import SandboxHost
from tests.helpers import require_docker

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
TCP = HEADER + (
    "   0: 00000000:18EB 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 501 1 0 100 0 0 10 0\n"
    "   1: 0100007F:2711 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 502 1 0 100 0 0 10 0\n"
    "   2: 020200C0:C3D8 FEA9FEA9:0050 06 00000000:00000000 03:00000447 00000000     0        0 0 3 0\n"
    "   3: 020200C0:2711 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 503 1 0 100 0 0 10 0\n"
)
TCP6 = HEADER + (
    "   0: 00000000000000000000000000000000:A3C2 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 601 1 0\n"
    "   1: 00000000000000000000000001000000:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 602 1 0\n"
    "   2: 0000000000000000FFFF00000100007F:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 603 1 0\n"
)


def test_listening_sockets_are_read_from_the_kernels_tables():
    assert parse_listeners(TCP) == [("0.0.0.0", 6379, 501), ("127.0.0.1", 10001, 502), ("192.0.2.2", 10001, 503)]
    mapped = str(ipaddress.ip_address("::ffff:127.0.0.1"))  # its text differs between Python versions
    assert parse_listeners(TCP6) == [("::", 41922, 601), ("::1", 8080, 602), (mapped, 80, 603)]


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", False),  # every interface, the Docker bridge's gateway among them
        ("::", False),
        ("192.0.2.2", False),  # the host's own address: a container reaches it through the bridge
        ("172.17.0.1", False),
        ("::ffff:192.0.2.2", False),
    ],
)
def test_only_loopback_is_out_of_a_containers_reach(address, loopback):
    assert is_loopback(address) is loopback


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server", "--log_dir=/tmp"], "gcs_server"),
        (["/venv/lib/python3.11/site-packages/ray/core/src/ray/raylet/raylet", "--x"], "raylet"),
        (["ray::SandboxHost", "", ""], "ray::SandboxHost"),
        (["ray::IDLE"], "ray::IDLE"),
        (["/venv/bin/python", "-m", "ray.util.client.server", "--port=10001"], "ray.util.client.server"),
        (
            ["/venv/bin/python", "-u", "/venv/lib/python3.11/site-packages/ray/_private/log_monitor.py"],
            "log_monitor.py",
        ),
        (["/venv/bin/python", "/venv/lib/python3.11/site-packages/ray/dashboard/dashboard.py"], "dashboard.py"),
        (["/venv/bin/python", "-m", "termgym", "run", "--cluster", "ray"], None),
        (["/usr/bin/xray", "run"], None),
        ([""], None),
    ],
)
def test_rays_processes_are_known_by_their_command(argv, name):
    assert ray_command(argv) == name


@pytest.mark.parametrize(
    ("address", "port", "text"),
    [("0.0.0.0", 6379, "0.0.0.0:6379"), ("::", 6379, "[::]:6379"), ("::ffff:192.0.2.2", 10001, "192.0.2.2:10001")],
)
def test_a_listener_is_shown_as_an_address_and_port(address, port, text):
    assert shown(address, port) == text


def fake_proc(root: Path, processes: dict[int, tuple[list[str], list[int]]]) -> Path:
    """A ``/proc`` with the kernel's tables above and ``processes``: pid -> (argv, socket inodes)."""
    (root / "net").mkdir(parents=True)
    (root / "net" / "tcp").write_text(TCP)
    (root / "net" / "tcp6").write_text(TCP6)
    for pid, (argv, inodes) in processes.items():
        (root / str(pid) / "fd").mkdir(parents=True)
        (root / str(pid) / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
        for fd, inode in enumerate(inodes, start=3):
            os.symlink(f"socket:[{inode}]", root / str(pid) / "fd" / str(fd))
        os.symlink("/dev/null", root / str(pid) / "fd" / "0")
    return root


def test_rays_listeners_off_loopback_are_exposed_and_no_one_elses(tmp_path):
    proc = fake_proc(
        tmp_path / "proc",
        {
            10: (["/x/ray/gcs/gcs_server"], [501]),  # 0.0.0.0:6379
            11: (["/venv/bin/python", "-m", "ray.util.client.server"], [502, 503]),  # loopback, then 192.0.2.2
            12: (["/x/ray/raylet/raylet"], [601, 602, 603]),  # [::], ::1, mapped loopback
            13: (["/usr/sbin/sshd"], []),
            14: (["/usr/bin/some-server"], [999]),
        },
    )
    assert exposed_ray_listeners(proc) == [
        "0.0.0.0:6379 (gcs_server)",
        "192.0.2.2:10001 (ray.util.client.server)",
        "[::]:41922 (raylet)",
    ]
    assert exposed_ray_listeners(fake_proc(tmp_path / "none", {13: (["/usr/sbin/sshd"], [501])})) == []


def test_the_refusal_is_for_both_backends_and_not_where_ray_is_firewalled(sandbox_dir):
    exposed = ["[::]:6379 (gcs_server)", "[::]:41922 (raylet)", "0.0.0.0:1 (a)", "0.0.0.0:2 (b)"]
    docker = SandboxHost("a1b2c3d4e5f6a7b8", "docker", str(sandbox_dir))
    docker.exposed = exposed
    line = docker.network_refusal()
    assert line is not None and line.startswith("no network for this sandbox: Ray on node a1b2c3d4e5f6")
    assert "[::]:6379 (gcs_server), [::]:41922 (raylet), 0.0.0.0:1 (a) and 1 more" in line
    assert "TERMGYM_RAY_PORTS_FIREWALLED=1" in line and "\n" not in line
    local = SandboxHost("a1b2c3d4e5f6a7b8", "local", str(sandbox_dir))
    local.exposed = exposed
    assert local.network_refusal() == line  # user-mode network reaches the cluster's other nodes
    firewalled = SandboxHost("a1b2c3d4e5f6a7b8", "docker", str(sandbox_dir), ports_firewalled=True)
    firewalled.exposed = exposed
    assert firewalled.network_refusal() is None
    nothing = SandboxHost("a1b2c3d4e5f6a7b8", "docker", str(sandbox_dir))
    nothing.exposed = []
    assert nothing.network_refusal() is None


@pytest.mark.docker
async def test_a_docker_sandbox_on_an_exposed_node_starts_without_network_and_says_why(task_dir, no_leaks):
    require_docker()
    from termgym.episode.spec import options_sandbox_spec
    from termgym.sandboxes.docker.engine import docker_client
    from termgym.tasks import load_task

    host = SandboxHost("a1b2c3d4e5f6a7b8", "docker", str(no_leaks))
    host.exposed = ["[::]:6379 (gcs_server)"]
    spec = replace(options_sandbox_spec(load_task(task_dir), EnvOptions(backend="docker")), network=True)
    sandbox_id, mirror = await host.start(spec, None)
    try:
        (line,) = [w for w in mirror["warnings"] if w.startswith("no network for this sandbox")]
        assert "[::]:6379 (gcs_server)" in line
        container = host.sandboxes[sandbox_id]._container  # type: ignore[attr-defined]
        networks = docker_client().api.inspect_container(container)["NetworkSettings"]["Networks"]
        assert set(networks) == {"none"}
        assert await host.call(sandbox_id, SetNetwork(True)) == line  # nor later, for the verifier
        assert set(docker_client().api.inspect_container(container)["NetworkSettings"]["Networks"]) == {"none"}
    finally:
        await host.leave()
