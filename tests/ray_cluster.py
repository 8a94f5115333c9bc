"""A real Ray cluster on this machine for the ``--cluster`` tests (the session fixture ``ray_cluster``
in conftest.py): a head and two more nodes, each a ``ray start`` of its own on 127.0.0.1 with its own
CPU count (2, 1 and 3, so placement shows), stopped at the end (``ray stop``), with bounded waits."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")
NODE_CPUS = (2, 1, 3)  # the head, then the two nodes
START_TIMEOUT = 120.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class RayCluster:
    address: str
    temp_dir: str
    node_ports: list[int] = field(default_factory=list)  # each node's node-manager port, head first

    def env(self) -> dict[str, str]:
        return {**os.environ, "RAY_ADDRESS": self.address, "RAY_USAGE_STATS_ENABLED": "0"}

    def start_node(self, cpus: int) -> int:
        """One more node (``ray start --address``); its node-manager port, which names its raylet."""
        port = free_port()
        _ray(
            "start",
            f"--address={self.address}",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={cpus}",
            f"--node-manager-port={port}",
            "--object-store-memory=80000000",
            env=self.env(),
        )
        self.node_ports.append(port)
        self.wait_nodes(len(self.node_ports))
        return port

    def kill_node(self, port: int) -> None:
        """End a node's raylet with SIGKILL (the node dies as a crashed machine's would)."""
        found = subprocess.run(["pgrep", "-f", f"raylet.*--node_manager_port={port}"], capture_output=True, text=True)
        pids = [int(pid) for pid in found.stdout.split()]
        assert pids, f"no raylet on port {port}"
        for pid in pids:
            os.kill(pid, 9)

    def alive(self) -> int:
        probe = "import ray; ray.init(log_to_driver=False); print('alive', sum(n['Alive'] for n in ray.nodes()))"
        result = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=self.env(), timeout=60
        )
        counts = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("alive ")]
        return int(counts[-1]) if counts else 0

    def node_id(self, port: int) -> str:
        """The Ray node id of the node whose node manager listens on ``port``."""
        probe = (
            "import ray, sys; ray.init(log_to_driver=False); "
            f"print('node', *[n['NodeID'] for n in ray.nodes() if n['Alive'] and n['NodeManagerPort'] == {port}])"
        )
        result = subprocess.run(
            [sys.executable, "-c", probe], capture_output=True, text=True, env=self.env(), timeout=60
        )
        found = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("node")]
        assert found and found[-1], f"no alive node on port {port}: {result.stderr[-500:]}"
        return found[-1][0]

    def wait_nodes(self, count: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while self.alive() != count:
            assert time.monotonic() < deadline, f"the Ray cluster never had {count} alive nodes"
            time.sleep(1)


def _ray(*args: str, env: dict[str, str]) -> None:
    result = subprocess.run([RAY, *args], capture_output=True, text=True, env=env, timeout=START_TIMEOUT)
    assert result.returncode == 0, result.stdout + result.stderr


@contextlib.contextmanager
def started_cluster() -> Iterator[RayCluster]:
    port, head_manager = free_port(), free_port()
    temp_dir = f"/tmp/tg-ray-{os.getpid()}"  # short: Ray's socket paths must fit in 107 bytes
    cluster = RayCluster(address=f"127.0.0.1:{port}", temp_dir=temp_dir)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        _ray(
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            f"--num-cpus={NODE_CPUS[0]}",
            f"--node-manager-port={head_manager}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
            "--object-store-memory=80000000",
            env=env,
        )
        cluster.node_ports.append(head_manager)
        for cpus in NODE_CPUS[1:]:
            cluster.start_node(cpus)
        yield cluster
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, env=env, timeout=120)
        subprocess.run(["rm", "-rf", temp_dir], check=False)
