"""Sandboxes on the nodes of a real Ray cluster (``--cluster``; the session's ``ray_cluster``: a head
and two nodes on 127.0.0.1, with 2, 1 and 3 CPUs): trials spread over every node within its cap, a
node killed mid-run, a driver killed with SIGKILL then ``termgym gc --cluster``, and the remote
sandbox's contract itself. Each run is a ``termgym`` process of its own (the driver), as a user runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, sandbox_processes, write_task

pytest.importorskip("ray", reason="the ray extra")

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leaks")]

SLOW_SOLVE = "#!/bin/sh\nsleep {seconds}\necho done > /app/result.txt\n"


def termgym_cli(cluster, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "termgym", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cluster.env(),
        cwd=REPO_ROOT,
    )


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trials.jsonl").read_text().splitlines()]


def test_trials_spread_over_every_node_within_its_cap(ray_cluster, tmp_path):
    task = write_task(tmp_path / "tasks", solve_sh=SLOW_SOLVE.format(seconds=1))
    out = tmp_path / "run"
    result = termgym_cli(
        ray_cluster,
        "run",
        str(task),
        "--agent",
        "oracle",
        "-k",
        "12",
        "--cluster",
        ray_cluster.address,
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    trials = records(out)
    assert len(trials) == 12 and all(t["resolved"] and t["error"] is None for t in trials), trials
    per_node = Counter(t["node"] for t in trials)
    assert len(per_node) == 3 and all(name.startswith("ray-") for name in per_node), per_node
    (metrics,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    peaks = metrics["node_peaks"]
    assert sorted(peaks.values()) == [1, 2, 3], peaks  # every node full at once, none past its CPUs


def test_a_node_killed_mid_run_gives_replaced_sandbox_errors_and_no_lost_record(ray_cluster, tmp_path):
    port = ray_cluster.start_node(2)  # this test's own node: the others stay for the rest of the session
    doomed = Path(os.environ["TERMGYM_SANDBOX_DIR"]) / f"node-{ray_cluster.node_id(port)[:12]}"
    task = write_task(tmp_path / "tasks", solve_sh=SLOW_SOLVE.format(seconds=6))
    out = tmp_path / "run"
    command = [sys.executable, "-m", "termgym", "run", str(task), "--agent", "oracle", "-k", "8"]
    command += ["--cluster", ray_cluster.address, "--out", str(out)]
    with subprocess.Popen(command, env=ray_cluster.env(), cwd=REPO_ROOT, stderr=subprocess.PIPE, text=True) as run:
        deadline = time.monotonic() + 120
        while not list(doomed.glob("tg-*")):  # trials running on the node about to die
            assert run.poll() is None, run.stderr.read() if run.stderr else ""
            assert time.monotonic() < deadline, "no trial started"
            time.sleep(0.5)
        ray_cluster.kill_node(port)
        run.wait(timeout=300)
    trials = records(out)
    failed = [t for t in trials if t["error"] is not None]
    why = [(t["error"], t["logs"].get("traceback", "")[-1500:]) for t in failed]
    assert failed and all(t["error"]["kind"] == "sandbox_error" for t in failed), why
    assert run.returncode == 0
    assert len({t["node"] for t in failed}) == 1  # the killed node's
    resolved = [t for t in trials if t["resolved"]]
    assert len(resolved) == 8 and failed[0]["node"] not in {t["node"] for t in resolved}  # replaced elsewhere
    ray_cluster.node_ports.remove(port)
    ray_cluster.wait_nodes(len(ray_cluster.node_ports))
    # the killed node's sandboxes died with it; their directories are the next actor's to remove
    assert list(doomed.glob("tg-*"))
    assert termgym_cli(ray_cluster, "gc", "--cluster", ray_cluster.address).returncode == 0
    assert not list(doomed.parent.glob("node-*"))


def test_a_driver_killed_leaves_what_gc_cluster_removes_on_every_node(ray_cluster, tmp_path):
    task = write_task(tmp_path / "tasks", solve_sh=SLOW_SOLVE.format(seconds=60))
    command = [sys.executable, "-m", "termgym", "run", str(task), "--agent", "oracle", "-k", "6"]
    command += ["--cluster", ray_cluster.address, "--out", str(tmp_path / "run")]
    root = Path(os.environ["TERMGYM_SANDBOX_DIR"])
    with subprocess.Popen(command, env=ray_cluster.env(), cwd=REPO_ROOT, start_new_session=True) as run:
        deadline = time.monotonic() + 120
        while len(list(root.glob("node-*/tg-*"))) < 6:
            assert run.poll() is None and time.monotonic() < deadline, "the sandboxes never started"
            time.sleep(0.5)
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
    result = termgym_cli(ray_cluster, "gc", "--cluster", ray_cluster.address)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and sum(int(line.split("removed ")[1].split()[0]) for line in lines) == 6, lines
    assert not list(root.glob("node-*/tg-*"))
    assert not [line for line in sandbox_processes() if str(root) in line]


def test_check_run_and_gc_with_a_cluster_in_this_process(ray_cluster, tmp_path, capsys):
    """The same commands in this process (the driver here): check on the least loaded node, a run
    spread over the nodes, gc on every node; the cluster left at the end (close_backends)."""
    from termgym.cli import main as termgym_main

    task = write_task(tmp_path / "tasks")
    assert termgym_main(["check", str(task), "--agent", "oracle", "--cluster", ray_cluster.address, "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["resolved"] and record["node"].startswith("ray-")
    out = tmp_path / "run"
    argv = ["run", str(task), "--agent", "oracle", "-k", "6", "--cluster", ray_cluster.address, "--out", str(out)]
    assert termgym_main([*argv, "--cpus-per-sandbox", "0.5"]) == 0
    trials = records(out)
    assert len(trials) == 6 and all(t["resolved"] for t in trials)
    assert len({t["node"] for t in trials}) >= 2
    capsys.readouterr()
    assert termgym_main(["gc", "--cluster", ray_cluster.address]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and all("removed 0 leftover local sandbox(es)" in line for line in lines), lines
    assert termgym_main(["gc", "--cluster", ray_cluster.address, "some-id"]) == 2  # one line: not with ids


REACH = 'for h in $HOSTS; do (exec 3<>"/dev/tcp/$h/$PORT") 2>/dev/null && echo "reached $h"; done; true'


async def test_ray_listens_on_every_interface_yet_an_embedded_sandbox_on_a_node_reaches_none(ray_cluster, tmp_path):
    """Ray 2.60 binds its GCS to every interface whatever --node-ip-address says (so a Docker sandbox
    with network gets none on such a node: test_exposure.py); an embedded sandbox has a private
    loopback and no other network, so it reaches the GCS port on no address of the host."""
    from termgym.episode.options import EnvOptions
    from termgym.episode.spec import options_sandbox_spec
    from termgym.sandboxes import close_backends, create_sandbox
    from termgym.sandboxes.ray.exposure import exposed_ray_listeners
    from termgym.tasks import load_task

    port = ray_cluster.address.rsplit(":", 1)[1]
    assert [line for line in exposed_ray_listeners() if line.endswith(f":{port} (gcs_server)")]
    hosts = " ".join(["127.0.0.1", *subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()])
    env = {"HOSTS": hosts, "PORT": port, "PATH": "/usr/bin:/bin"}
    control = subprocess.run(["bash", "-c", REACH], capture_output=True, text=True, env=env, timeout=60)
    assert "reached 127.0.0.1" in control.stdout  # the probe reaches the GCS from the host itself
    task = write_task(tmp_path / "tasks")
    spec = options_sandbox_spec(load_task(task), EnvOptions())
    sandbox = create_sandbox("local", spec, cluster=ray_cluster.address)
    try:
        await sandbox.start()
        result = await sandbox.exec(["bash", "-c", REACH], timeout=60, env=env, cwd="/")
    finally:
        await sandbox.stop()
        await close_backends()  # the registry's ray entry leaves the cluster
    assert result.exit_code == 0 and b"reached" not in result.output, result.output
