"""Joining a Ray cluster (``termgym.sandboxes.ray.join``): an address where no Ray answers is one
line and exit 2 within the connect timeout, through the real CLI as a new user runs it, with Ray's
own log lines kept off the terminal. Plus the pure parts: the address, the timeout, the probe."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import pytest

from termgym.errors import ConfigError
from termgym.sandboxes.ray.join import DEFAULT_CONNECT_TIMEOUT, connect_timeout, endpoint, probe
from tests.helpers import REPO_ROOT
from tests.ray_cluster import free_port

TASK = str(REPO_ROOT / "envs" / "file-ops" / "bulk-rename")  # a bundled task
STARTUP = 20.0  # seconds the CLI may take to start and exit on a busy machine, beyond the wait


@pytest.mark.parametrize(
    ("address", "ray_address", "expected"),
    [
        ("ray://head.example:10001", None, ("head.example", 10001)),
        ("10.0.0.5:6379", None, ("10.0.0.5", 6379)),
        ("[::1]:6379", None, ("::1", 6379)),
        ("ray", None, None),  # Ray looks for the cluster `ray start` made here
        ("ray", "auto", None),
        ("ray", "127.0.0.1:7000", ("127.0.0.1", 7000)),
        ("ray", "ray://h:10001", ("h", 10001)),
    ],
)
def test_the_endpoint_an_address_must_answer_at(address, ray_address, expected):
    environ = {} if ray_address is None else {"RAY_ADDRESS": ray_address}
    assert endpoint(address, environ) == expected


@pytest.mark.parametrize("address", ["foo", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999", "http://h:80/x", ":6379"])
def test_an_address_without_a_host_and_port_is_bad_input(address):
    with pytest.raises(ConfigError, match="not a Ray cluster address"):
        endpoint(address, {})


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, DEFAULT_CONNECT_TIMEOUT), ("", DEFAULT_CONNECT_TIMEOUT), ("2.5", 2.5), ("60", 60.0)]
)
def test_the_connect_timeout_is_settable(raw, expected):
    assert connect_timeout({} if raw is None else {"TERMGYM_RAY_CONNECT_TIMEOUT": raw}) == expected


@pytest.mark.parametrize("raw", ["0", "-1", "soon", "nan"])
def test_a_connect_timeout_that_is_not_a_positive_number_is_bad_input(raw):
    with pytest.raises(ConfigError, match="TERMGYM_RAY_CONNECT_TIMEOUT"):
        connect_timeout({"TERMGYM_RAY_CONNECT_TIMEOUT": raw})


@contextmanager
def listener(answer: bytes | None) -> Iterator[int]:
    """A TCP server on loopback that sends ``answer`` to each connection (None: says nothing); its port."""
    server = socket.create_server(("127.0.0.1", 0))
    connections: list[socket.socket] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:
                return
            connections.append(connection)
            if answer is not None:
                connection.sendall(answer)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        server.close()
        for connection in connections:
            connection.close()


SETTINGS = b"\x00\x00\x06\x04\x00\x00\x00\x00\x00" + b"\x00\x03\x00\x00\x00\x64"  # an HTTP/2 server's first frame


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        (SETTINGS, None),
        (b"SSH-2.0-OpenSSH_9.2\r\n", "not Ray"),
        (b"HTTP/1.1 400 Bad Request\r\n\r\n", "not Ray"),
        (None, "said nothing within 0.5s"),
    ],
    ids=["grpc", "ssh", "http1", "silent"],
)
def test_the_probe_knows_a_grpc_server_from_anything_else(answer, why):
    with listener(answer) as port:
        found = probe("127.0.0.1", port, 0.5)
    assert found == why if why is None else why in (found or ""), found


def test_the_probe_of_a_closed_port_says_refused_at_once():
    started = time.monotonic()
    assert probe("127.0.0.1", free_port(), 5.0) == "connection refused"
    assert time.monotonic() - started < 1.0


def termgym_run(cluster: str, timeout: float | None = None) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "RAY_USAGE_STATS_ENABLED": "0"}
    if timeout is not None:
        env["TERMGYM_RAY_CONNECT_TIMEOUT"] = str(timeout)
    command = [sys.executable, "-m", "termgym", "run", TASK, "--cluster", cluster, "--out", "/dev/null/never"]
    started = time.monotonic()
    result = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=(timeout or 30) + 120
    )
    return result, time.monotonic() - started


def assert_one_line(result: subprocess.CompletedProcess[str], says: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("termgym: error: ") and says in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr and not result.stdout


@pytest.mark.parametrize("port", [1, free_port()], ids=["port-1", "a-closed-port"])
def test_run_with_a_cluster_address_where_nothing_listens_is_one_line_at_once(port):
    pytest.importorskip("ray", reason="the ray extra")
    result, took = termgym_run(f"127.0.0.1:{port}")
    assert_one_line(result, f"no Ray cluster answers at 127.0.0.1:{port} (connection refused)")
    assert took < STARTUP, took


def test_run_with_a_cluster_address_where_something_else_listens_waits_no_more_than_the_timeout():
    pytest.importorskip("ray", reason="the ray extra")
    with listener(None) as port:
        result, took = termgym_run(f"127.0.0.1:{port}", timeout=2)
    assert_one_line(result, "said nothing within 2s")
    assert took < 2 + STARTUP, took


@pytest.mark.slow
def test_a_grpc_server_that_is_not_ray_ends_the_join_at_the_timeout_without_rays_log_lines():
    """It passes the probe; ``ray.init`` itself would retry for minutes, printing Ray's C++ log."""
    pytest.importorskip("ray", reason="the ray extra")
    import grpc

    server = grpc.server(ThreadPoolExecutor(2))
    port = server.add_insecure_port("0.0.0.0:0")
    server.start()
    try:
        result, took = termgym_run(f"127.0.0.1:{port}", timeout=8)
    finally:
        server.stop(None)
    assert_one_line(result, "did not let this process join within 8s")
    assert "rpc_client" not in result.stderr and "gcs_client" not in result.stderr
    assert took < 8 + STARTUP, took
    log = result.stderr.split("Ray's log: ")[1].strip()
    try:
        with open(log) as lines:
            assert "gcs_client" in lines.read()  # Ray's lines went to the log, not the terminal
    finally:
        os.unlink(log)
