"""A real Ray cluster on this machine for the ``--cluster`` tests (the session fixture ``ray_cluster``
in conftest.py): a head and two more nodes, each a ``ray start`` of its own on 127.0.0.1 with its own
CPU count (2, 1 and 3, so placement shows), with bounded waits.

Each ``ray start`` runs in a session of its own, and every process Ray starts for that node (its GCS,
raylet, agents and workers) stays in it; the end stops those sessions' processes by their ids
(``end_sessions``): never ``ray stop``, which ends every Ray process on the machine, a cluster of the
user's own beside ``make test`` included."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")
NODE_CPUS = (2, 1, 3)  # the head, then the two nodes
START_TIMEOUT = 120.0
STOP_GRACE = 3.0  # seconds between SIGTERM and SIGKILL (Ray's GCS and raylet take longer to stop on SIGTERM)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def session_processes(sessions: Iterable[int]) -> list[int]:
    """The pids of the processes in ``sessions`` (by session id, from ``/proc/<pid>/stat``)."""
    wanted, found = set(sessions), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # it ended meanwhile
        if int(fields[3]) in wanted and fields[0] != "Z":  # state, ppid, pgrp, session
            found.append(int(stat.parent.name))
    return found


def end_sessions(sessions: Iterable[int], grace: float = STOP_GRACE) -> list[int]:
    """End every process in ``sessions``: SIGTERM, then SIGKILL what is left after ``grace``
    seconds. The pids still there 10 s later (none, unless the kernel is stuck)."""
    sessions = list(sessions)
    for signum, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        for pid in session_processes(sessions):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        deadline = time.monotonic() + wait
        while session_processes(sessions) and time.monotonic() < deadline:
            time.sleep(0.1)
    return session_processes(sessions)


def ray_start(*args: str, env: dict[str, str]) -> int:
    """``ray start ARGS`` in a session of its own; that session's id (the processes it left running
    are in it)."""
    with subprocess.Popen(
        [RAY, "start", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,
    ) as started:
        try:
            output, _ = started.communicate(timeout=START_TIMEOUT)
        except subprocess.TimeoutExpired:
            end_sessions([started.pid])
            raise
        if started.returncode != 0:
            end_sessions([started.pid])
            raise AssertionError(f"ray start {' '.join(args)} failed: {output[-3000:]}")
        return started.pid


@dataclass
class RayCluster:
    address: str
    temp_dir: str
    node_ports: list[int] = field(default_factory=list)  # each node's node-manager port, head first
    sessions: dict[int, int] = field(default_factory=dict)  # node-manager port: its ray start's session

    def env(self) -> dict[str, str]:
        return {**os.environ, "RAY_ADDRESS": self.address, "RAY_USAGE_STATS_ENABLED": "0"}

    def start_node(self, cpus: int) -> int:
        """One more node (``ray start --address``); its node-manager port, which names its raylet."""
        port = free_port()
        self.sessions[port] = ray_start(
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
        ours = set(session_processes([self.sessions[port]]))
        pids = [int(pid) for pid in found.stdout.split() if int(pid) in ours]
        assert pids, f"no raylet on port {port}"
        for pid in pids:
            os.kill(pid, 9)

    def processes(self) -> list[int]:
        """The pids of every process this cluster's ``ray start``s left running."""
        return session_processes(self.sessions.values())

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


def start_head(port: int, temp_dir: str, *, cpus: int, node_manager_port: int | None = None) -> int:
    """``ray start --head`` on 127.0.0.1:``port`` (no dashboard); its session id."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    args = ["--head", "--node-ip-address=127.0.0.1", f"--port={port}", f"--num-cpus={cpus}"]
    if node_manager_port is not None:
        args.append(f"--node-manager-port={node_manager_port}")
    args += ["--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp_dir}"]
    return ray_start(*args, "--object-store-memory=80000000", env=env)


@contextlib.contextmanager
def started_cluster(node_cpus: tuple[int, ...] = NODE_CPUS) -> Iterator[RayCluster]:
    """A head and ``len(node_cpus) - 1`` more nodes; at the end, every process they started is
    ended by its id, and their temp directory removed."""
    port, head_manager = free_port(), free_port()
    temp_dir = f"/tmp/tg-ray-{os.getpid()}-{port}"  # short: Ray's socket paths must fit in 107 bytes
    cluster = RayCluster(address=f"127.0.0.1:{port}", temp_dir=temp_dir)
    try:
        cluster.sessions[head_manager] = start_head(port, temp_dir, cpus=node_cpus[0], node_manager_port=head_manager)
        cluster.node_ports.append(head_manager)
        for cpus in node_cpus[1:]:
            cluster.start_node(cpus)
        yield cluster
    finally:
        left = end_sessions(cluster.sessions.values())
        subprocess.run(["rm", "-rf", temp_dir], check=False)
        assert not left, f"processes of the test's Ray cluster still running: {left}"
