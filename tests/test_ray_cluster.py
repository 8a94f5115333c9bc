"""The Ray fixture (tests/ray_cluster.py) ends only what it started: a Ray cluster of the user's own
on this machine, started before the fixture's, still runs and answers after the fixture's end, and
none of the fixture's processes is left."""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path

import pytest

from tests.ray_cluster import end_sessions, free_port, session_processes, start_head, started_cluster

pytest.importorskip("ray", reason="the ray extra")

pytestmark = [pytest.mark.slow]


def core_processes(session: int) -> set[int]:
    """The GCS and raylet of the cluster a ``ray start`` session holds (its workers come and go)."""
    found = set()
    for pid in session_processes([session]):
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        if command.endswith((b"/gcs_server", b"/raylet")):
            found.add(pid)
    return found


def test_the_fixture_ends_its_own_ray_processes_and_not_a_users_cluster():
    port, temp_dir = free_port(), f"/tmp/tg-ray-user-{os.getpid()}"
    users = start_head(port, temp_dir, cpus=1)  # the user's own cluster, running beside `make test`
    try:
        core = core_processes(users)
        assert len(core) == 2, core
        with started_cluster(node_cpus=(1,)) as cluster:
            ours = cluster.processes()
            assert ours and not set(ours) & set(session_processes([users]))
            assert cluster.alive() == 1  # the fixture's cluster is its own, not joined to the user's
        assert not cluster.processes()  # every process the fixture started has ended
        assert core <= set(session_processes([users])), "the fixture ended the user's cluster"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the user's GCS still answers
    finally:
        left = end_sessions([users])
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert not left
