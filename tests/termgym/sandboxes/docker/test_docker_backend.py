"""The Docker backend against the real engine: builds, cache, limits, faults, cleanup."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from termgym.agents import OracleAgent, ScriptedAgent
from termgym.env import SUBMIT
from termgym.episode.options import EnvOptions
from termgym.images import build as images
from termgym.sandboxes.docker import docker_client
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import KIT_SOURCE, pids_matching, require_docker, termgym, termgym_containers, write_task

pytestmark = pytest.mark.docker


@pytest.fixture(autouse=True)
def engine():
    require_docker()


@pytest.fixture
def backend() -> str:
    return "docker"


def unique_dockerfile(extra: str = "") -> str:
    """A Dockerfile no earlier test has built (a fresh content hash)."""
    return f"FROM debian:bookworm-slim\nWORKDIR /app\nRUN echo {uuid.uuid4().hex} > /etc/build-id\n{extra}"


def termgym_cli(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return termgym(*args, env=env, timeout=timeout)


async def test_failed_build_is_recorded_with_its_log(tmp_path, backend, no_leaks):
    task = write_task(tmp_path, dockerfile=unique_dockerfile("RUN echo compiling && exit 3\n"))
    record = await run_trial(load_task(task), OracleAgent(), EnvOptions(backend="docker"))
    assert record.error is not None, record
    assert record.error["kind"] == "build_failed"
    assert "compiling" in record.logs["build"]
    assert "docker build failed" in record.error["message"]


def test_missing_base_image_without_alias_is_one_line_exit_1(tmp_path, backend, no_leaks):
    task = write_task(tmp_path, dockerfile="FROM registry.invalid/nothing:1\nWORKDIR /app\n")
    result = termgym_cli("check", str(task), "--backend", "docker", "--json")
    assert result.returncode == 1
    record = json.loads(result.stdout)
    assert record["error"]["kind"] == "build_failed"
    assert (
        "\n" not in record["error"]["message"]
        and "could not pull image registry.invalid/nothing:1" in record["error"]["message"]
    )


def test_image_alias_from_the_command_line(tmp_path, backend, no_leaks):
    task = write_task(tmp_path, dockerfile="FROM myorg/base:7\nWORKDIR /app\n")
    result = termgym_cli(
        "check", str(task), "--backend", "docker", "--json", "--image-alias", f"myorg/base:7={images.BASE_IMAGE}"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["resolved"]


async def test_unchanged_task_never_rebuilds_and_concurrent_trials_build_once(tmp_path, backend, no_leaks, monkeypatch):
    task = load_task(write_task(tmp_path, dockerfile=unique_dockerfile("RUN sleep 1\n")))
    builds = []
    real_build = images._build

    def counting_build(*args, **kwargs):
        builds.append(args[1])
        return real_build(*args, **kwargs)

    monkeypatch.setattr(images, "_build", counting_build)
    records = await asyncio.gather(*(run_trial(task, OracleAgent(), EnvOptions(backend="docker")) for _ in range(4)))
    assert all(r.resolved for r in records), [r.error for r in records]
    again = await run_trial(task, OracleAgent(), EnvOptions(backend="docker"))
    assert again.resolved
    assert len(builds) == 1 and builds[0].startswith("termgym-task/")


async def test_docker_image_field_runs_without_a_dockerfile(tmp_path, backend, no_leaks):
    task = write_task(tmp_path, solve_sh="#!/bin/bash\nmkdir -p /app && echo done > /app/result.txt\n")
    (task / "environment" / "Dockerfile").unlink()
    with open(task / "task.toml", "a") as handle:
        handle.write(f'docker_image = "{images.BASE_IMAGE}"\n')
    record = await run_trial(load_task(task), OracleAgent(), EnvOptions(backend="docker"))
    assert record.resolved, record.error


class KillContainerMidway:
    """Runs one command, has the container killed from outside, then tries another."""

    name = "killer"

    async def run(self, env, instruction, info):
        await env.step("echo before")
        docker_client().api.kill(env.sandbox._container)
        step = await env.step("echo after")
        return step if env.done else await env.step(SUBMIT)


async def test_container_killed_from_outside_is_a_sandbox_error(task_dir, backend, no_leaks):
    record = await run_trial(load_task(task_dir), KillContainerMidway(), EnvOptions(backend="docker"))
    assert record.error is not None, record
    assert record.error["kind"] == "sandbox_error"
    follow_up = await run_trial(load_task(task_dir), OracleAgent(), EnvOptions(backend="docker"))
    assert follow_up.resolved  # the run goes on


def test_daemon_not_running_is_one_line_with_a_hint(task_dir):
    result = termgym_cli(
        "check", str(task_dir), "--backend", "docker", env={"DOCKER_HOST": "unix:///tmp/no-such-docker.sock"}
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "dockerd" in lines[0] and "Traceback" not in result.stderr


LIMITED = '[environment]\ncpus = 1\nmemory_mb = 128\nstorage_mb = 64\nnetwork_mode = "no-network"\n'


@pytest.mark.parametrize(
    ("attack", "survivor_check"),
    [
        ("bomb() { bomb | bomb & }; bomb; sleep 5", None),
        ("head -c 600000000 /dev/zero | tail -c 400000000 > /dev/null", None),
        ("head -c 200000000 /dev/zero > /app/big; ls -l /app/big", "File size limit"),
    ],
    ids=["fork-bomb", "memory-hog", "disk-filler"],
)
async def test_resource_attacks_are_contained(tmp_path, backend, no_leaks, attack, survivor_check):
    task = write_task(tmp_path, agent_timeout=20)
    toml = (task / "task.toml").read_text().replace('[environment]\nnetwork_mode = "no-network"\n', LIMITED)
    (task / "task.toml").write_text(toml)
    started = time.monotonic()
    record = await run_trial(
        load_task(task),
        ScriptedAgent((attack, "echo done > /app/result.txt")),
        EnvOptions(backend="docker", command_timeout=10),
    )
    assert time.monotonic() - started < 90
    # A fork bomb may leave the agent's shell unable to fork at all: then the trial ends with a
    # sandbox_error record; otherwise the verifier grades what was left.
    assert record.error is None or record.error["kind"] in ("agent_timeout", "sandbox_error"), record.error
    assert record.total == 2 or (record.error is not None and record.error["kind"] == "sandbox_error")
    probe = subprocess.run(["true"], timeout=5)  # the host still answers
    assert probe.returncode == 0


def test_gc_removes_containers_of_a_killed_run(tmp_path, backend):
    task = write_task(tmp_path, solve_sh="#!/bin/bash\nsleep 120\n")
    before = set(termgym_containers())
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "termgym",
            "run",
            str(task),
            "--backend",
            "docker",
            "-k",
            "2",
            "-n",
            "2",
            "--out",
            str(tmp_path / "run"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    # both containers created and running processes (a container is listed before it starts)
    while time.monotonic() < deadline:
        started = set(termgym_containers()) - before
        if len(started) >= 2 and all(processes_of_containers({c}) for c in started):
            break
        time.sleep(0.2)
    assert len(set(termgym_containers()) - before) >= 2, "the run never started its containers"
    process.send_signal(signal.SIGKILL)
    process.wait()
    leftover = set(termgym_containers()) - before
    assert leftover, "containers vanished by themselves; gc was not exercised"
    assert processes_of_containers(leftover), "the check below could not see the containers' processes"
    result = termgym_cli("gc", "--backend", "docker")
    assert result.returncode == 0
    assert termgym_containers() == [], "labelled containers survived gc"
    # No process of the removed containers survives them (found by the container id in its cgroup).
    deadline = time.monotonic() + 30
    while (survivors := processes_of_containers(leftover)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not survivors, survivors


def processes_of_containers(container_ids: set[str]) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cgroup = Path(f"/proc/{pid}/cgroup").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(container_id in cgroup for container_id in container_ids):
            found.append(f"{pid} {cmdline}")
    return found


def test_tb1_compose_with_extra_services_is_reported_unsupported(tmp_path, backend):
    task = tmp_path / "tb1"
    (task / "tests").mkdir(parents=True)
    (task / "task.yaml").write_text("instruction: do it\n")
    (task / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    (task / "docker-compose.yaml").write_text("services:\n  client:\n    build: .\n  db:\n    image: postgres:16\n")
    (task / "run-tests.sh").write_text("#!/bin/bash\nexit 0\n")
    result = termgym_cli("check", str(task), "--backend", "docker", "--json")
    record = json.loads(result.stdout)
    assert result.returncode == 1 and record["error"]["kind"] == "sandbox_error"
    assert "db" in record["error"]["message"] and "not supported" in record["error"]["message"]


async def test_task_needing_network_fails_clearly_without_a_bridge(tmp_path, backend, no_leaks):
    task = write_task(tmp_path)
    (task / "task.toml").write_text(
        (task / "task.toml").read_text().replace('network_mode = "no-network"', 'network_mode = "public"')
    )
    record = await run_trial(load_task(task), OracleAgent(), EnvOptions(backend="docker"))
    assert record.error is not None, record
    assert record.error["kind"] == "sandbox_error" and "no bridge network" in record.error["message"]
    assert "--network none" in record.error["message"]


async def test_verifier_files_arrive_only_at_verification(tmp_path, backend, no_leaks):
    test_sh = textwrap.dedent(f"""\
        #!/bin/sh
        {KIT_SOURCE}
        tg_check_sh "agent saw no tests" 'grep -qx empty /app/seen'
        tg_finish
        """)
    task = write_task(tmp_path, test_sh=test_sh)
    record = await run_trial(
        load_task(task),
        ScriptedAgent(('[ -z "$(ls -A /tests 2>/dev/null)" ] && echo empty > /app/seen',)),
        EnvOptions(backend="docker"),
    )
    assert record.resolved, record.assertions


async def test_used_up_pids_limit_still_verifies(tmp_path, backend, no_leaks):
    """With every pid taken, the engine cannot start the in-container killer: the container is
    restarted instead, and the verifier grades the files the agent left."""
    task = write_task(tmp_path)
    hog = "echo done > /app/result.txt; (for i in $(seq 700); do sleep 1000 & done) >/dev/null 2>&1 &"
    settle = "SECONDS=0; while [ $SECONDS -lt 4 ]; do :; done"  # builtins only: no pid needed
    record = await run_trial(
        load_task(task), ScriptedAgent((hog, settle)), EnvOptions(backend="docker", command_timeout=20)
    )
    assert record.error is None, record.error
    assert record.resolved and record.total == 2
    assert not pids_matching("sleep 1000")


async def test_ending_the_agents_processes_spares_nothing_not_even_the_init(tmp_path, backend, no_leaks):
    """Before verification the container is restarted: the verifier sees a new PID 1 (the old kill
    loop spared it and its keeper, which a root process could rewrite), the agent's detached
    process is gone, and the files it wrote are graded."""
    test_sh = textwrap.dedent(f"""\
        #!/bin/sh
        {KIT_SOURCE}
        tg_check "result exists" test -f /app/result.txt
        tg_check_sh "a new init" '[ "$(cut -d" " -f22 /proc/1/stat)" != "$(cat /app/init-start)" ]'
        tg_check_sh "no agent process" '! grep -qs "1000[0]8" /proc/[0-9]*/cmdline'
        tg_finish
        """)
    task = write_task(tmp_path, test_sh=test_sh)
    agent = ScriptedAgent(
        ("echo done > /app/result.txt; cut -d' ' -f22 /proc/1/stat > /app/init-start; (setsid sleep 100008 &)",)
    )
    record = await run_trial(load_task(task), agent, EnvOptions(backend="docker"))
    assert record.error is None and record.resolved, record
    assert not pids_matching("sleep 100008")


async def test_a_trial_cancelled_while_its_container_is_being_created_leaves_no_container(
    task_dir, backend, no_leaks, monkeypatch
):
    task = load_task(task_dir)
    assert (await run_trial(task, OracleAgent(), EnvOptions(backend=backend))).resolved  # the image is built
    api = docker_client().api
    real_create, creating = api.create_container, threading.Event()

    def slow_create(*args, **kwargs):  # the engine answers after the trial was cancelled
        creating.set()
        created = real_create(*args, **kwargs)
        time.sleep(0.5)
        return created

    monkeypatch.setattr(api, "create_container", slow_create)
    trial = asyncio.create_task(run_trial(task, OracleAgent(), EnvOptions(backend=backend)))
    while not creating.is_set():
        await asyncio.sleep(0.01)
    trial.cancel()
    with pytest.raises(asyncio.CancelledError):
        await trial
    # no_leaks: no labelled container is left
