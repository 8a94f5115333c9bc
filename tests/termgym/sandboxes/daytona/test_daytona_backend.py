"""The Daytona backend end to end: the real SDK over HTTP to the local API server, each sandbox a
real local sandbox. Trials, the create request, snapshots, the shell over a session, files."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time

import pytest

from termgym.agents import NullAgent, OracleAgent, ScriptedAgent
from termgym.episode.options import EnvOptions
from termgym.episode.spec import sandbox_spec
from termgym.errors import BackendUnavailable
from termgym.sandboxes import create_sandbox, preflight
from termgym.sandboxes.daytona.backend import DaytonaSandbox
from termgym.sandboxes.daytona.provider import get_provider
from termgym.sandboxes.files import upload_files
from termgym.tasks import load_task
from termgym.trial import run_trial
from tests.helpers import pids_matching, write_task

pytestmark = pytest.mark.usefixtures("daytona")


def options(**overrides) -> EnvOptions:
    return EnvOptions(backend="daytona", run_id="run-1", **overrides)


async def test_oracle_and_null_trials_through_the_sdk(task_dir, daytona):
    task = load_task(task_dir)
    oracle = await run_trial(task, OracleAgent(), options())
    null = await run_trial(task, NullAgent(), options())
    assert oracle.error is None and oracle.resolved and oracle.passed == 2 and oracle.backend == "daytona"
    assert null.error is None and not null.resolved and null.total == 2
    assert not daytona.live()


async def test_create_request_carries_labels_limits_and_lifetime(tmp_path, daytona):
    task_dir = write_task(tmp_path, name="net-task")
    (task_dir / "task.toml").write_text((task_dir / "task.toml").read_text().replace('"no-network"', '"public"'))
    await run_trial(load_task(write_task(tmp_path / "b")), NullAgent(), options())
    await run_trial(load_task(task_dir), NullAgent(), options())
    closed, open_ = daytona.create_bodies
    assert closed["labels"] == {
        "termgym": "1",
        "termgym.run": "run-1",
        "termgym.task": "demo",
        "code-toolbox-language": "python",
    }
    assert closed["networkBlockAll"] is True and open_["networkBlockAll"] is False
    assert closed["autoDeleteInterval"] == 0  # ephemeral: deleted as soon as it stops
    assert closed["autoStopInterval"] == 60 and closed["ttlMinutes"] == 240
    assert closed["user"] == "root"
    assert re.fullmatch(r"termgym-[0-9a-f]{12}", closed["snapshot"])
    assert daytona.snapshots[closed["snapshot"]]["cpu"] == 1 and daytona.snapshots[closed["snapshot"]]["mem"] == 2


async def test_snapshot_is_built_once_and_reused_across_runs(tmp_path, daytona):
    task = load_task(write_task(tmp_path))
    await asyncio.gather(*(run_trial(task, NullAgent(), options()) for _ in range(3)))
    builds = [r for r in daytona.requests if r.method == "POST" and r.path == "/api/snapshots"]
    assert len(builds) == 1
    # A new process (a new provider) finds the snapshot by name and does not build it again.
    get_provider()._snapshots_ready.clear()
    await run_trial(task, NullAgent(), options())
    assert len([r for r in daytona.requests if r.method == "POST" and r.path == "/api/snapshots"]) == 1
    # A different environment gets a different snapshot.
    other = load_task(write_task(tmp_path / "other", dockerfile="FROM debian:bookworm-slim\nWORKDIR /srv\n"))
    await run_trial(other, NullAgent(), options())
    assert len(daytona.snapshots) == 2


async def test_failed_build_is_a_record_with_the_log_and_is_not_retried(tmp_path, daytona):
    dockerfile = "FROM debian:bookworm-slim\nWORKDIR /app\nRUN echo building && exit 7\n"
    task = load_task(write_task(tmp_path, dockerfile=dockerfile))
    first = await run_trial(task, OracleAgent(), options())
    second = await run_trial(task, OracleAgent(), options())
    assert first.error is not None, first
    assert first.error["kind"] == "build_failed" and "building" in first.logs["build"]
    assert second.error == first.error
    assert len([r for r in daytona.requests if r.path == "/api/snapshots" and r.method == "POST"]) == 1
    assert not daytona.create_times  # no sandbox was attempted


async def test_image_and_workdir_come_from_the_dockerfile(tmp_path, daytona):
    dockerfile = (
        'FROM debian:bookworm-slim\nENV GREETING="hi there"\nWORKDIR /srv/data\nRUN echo seeded > /srv/data/seed.txt\n'
    )
    spec = sandbox_spec(load_task(write_task(tmp_path, dockerfile=dockerfile)), run_id="r")
    async with create_sandbox("daytona", spec) as sandbox:
        result = await sandbox.exec(["sh", "-c", 'echo "$GREETING"; pwd; cat seed.txt'], timeout=10)
    assert result.exit_code == 0 and result.text == "hi there\n/srv/data\nseeded\n"


async def test_exec_contract(task_dir, daytona):
    spec = sandbox_spec(load_task(task_dir), run_id="r")
    async with DaytonaSandbox(spec) as sandbox:
        code = await sandbox.exec(["sh", "-c", "echo out; echo err >&2; exit 5"], timeout=10)
        assert (code.exit_code, code.text, code.timed_out) == (5, "out\nerr\n", False)
        piped = await sandbox.exec(["tr", "a-z", "A-Z"], timeout=10, stdin=b"hello\n")
        assert piped.text == "HELLO\n"
        env = await sandbox.exec(["env"], timeout=10, env={"ONLY": "this"}, cwd="/tmp")
        assert env.text == "ONLY=this\n"
        started = time.monotonic()
        slow = await sandbox.exec(["sh", "-c", "sleep 100007 & sleep 100007"], timeout=1)
        assert slow.timed_out and slow.exit_code is None and time.monotonic() - started < 8
        flood = await sandbox.exec(
            ["sh", "-c", "head -c 300000 /dev/zero | tr '\\0' x; echo END"], timeout=10, output_limit=1000
        )
        assert len(flood.output) == 1000 and flood.dropped_bytes == 300004 - 1000 and flood.text.endswith("END\n")
        weird = await sandbox.exec(["printf", "%s", 'it\'s "quoted" $HOME `x` \\ ✓'], timeout=10)
        assert weird.text == 'it\'s "quoted" $HOME `x` \\ ✓'
    assert not pids_matching("sleep 100007")


async def test_files_travel_in_bulk_with_modes(task_dir, tmp_path, daytona):
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o755)
    data = tmp_path / "data.bin"
    data.write_bytes(bytes(range(256)) * 100)
    sandbox = DaytonaSandbox(sandbox_spec(load_task(task_dir), run_id="r"))
    async with sandbox:
        await upload_files(sandbox, [(script, "bin/run.sh"), (data, "deep/er/data.bin")], "/opt/up")
        ran = await sandbox.exec(["/opt/up/bin/run.sh"], timeout=10)
        files = await sandbox.download_files(["/opt/up/deep/er/data.bin", "/no/such/file"])
    assert ran.text == "ran\n"
    assert files == {"/opt/up/deep/er/data.bin": data.read_bytes(), "/no/such/file": None}
    uploads = [r for r in daytona.requests if r.path.endswith("/files/bulk-upload")]
    assert len(uploads) == 1  # one archive for every file


async def test_persistent_shell_over_a_session(task_dir, daytona):
    record = await run_trial(
        load_task(task_dir),
        ScriptedAgent(
            (
                "cd /tmp && export KEPT=yes && f() { echo fn-$1; }",
                'echo "$PWD $KEPT $(f 1)" > /app/state.txt',
                "sleep 100008",
                'cat /app/state.txt; echo "$KEPT" >> /app/state.txt',
                "echo done > /app/result.txt",
            )
        ),
        options(command_timeout=1.5),
    )
    assert record.error is None and record.resolved and record.turns == 5
    assert any(r.path.endswith("/input") for r in daytona.requests)
    assert not pids_matching("sleep 100008")


async def test_shell_state_timeouts_and_output_through_the_env(task_dir, daytona):
    from termgym.env import AsyncTerminalEnv

    async with AsyncTerminalEnv(load_task(task_dir), options(command_timeout=2.0)) as env:
        await env.reset()
        obs, *_ = await env.step("cd /tmp; X=41")
        obs, _, _, _, info = await env.step("echo $((X+1)) $PWD")
        assert obs == "42 /tmp\n" and info["exit_code"] == 0
        obs, _, _, _, info = await env.step("false")
        assert info["exit_code"] == 1
        started = time.monotonic()
        obs, _, _, _, info = await env.step("while :; do :; done")
        assert info["timed_out"] and not info["shell_restarted"] and time.monotonic() - started < 10
        obs, _, _, _, info = await env.step("echo $X; head -c 200000 /dev/zero | tr '\\0' y; echo")
        assert obs.startswith("41\n") and info["dropped_bytes"] > 0
        obs, _, _, _, info = await env.step("printf 'no newline'")
        assert obs == "no newline"
        obs, _, _, _, info = await env.step("exit 3")
        assert info["shell_restarted"]
        obs, _, _, _, info = await env.step("pwd")
        assert obs == "/tmp\n"


async def test_background_processes_do_not_survive_verification(task_dir, daytona):
    record = await run_trial(
        load_task(task_dir),
        ScriptedAgent(
            (
                "sleep 100009 &",
                "(setsid sleep 100010 &)",
                "nohup sh -c 'trap \"\" TERM HUP; exec sleep 100011' >/dev/null 2>&1 &",
                "echo done > /app/result.txt",
            )
        ),
        options(),
    )
    assert record.error is None and record.resolved
    for marker in ("100009", "100010", "100011"):
        assert not pids_matching(f"sleep {marker}"), f"sleep {marker} survived"


async def test_planted_reports_do_not_count(task_dir, daytona):
    ctrf = '{"results":{"tests":[{"name":"a","status":"passed"}]}}'
    record = await run_trial(
        load_task(task_dir),
        ScriptedAgent((f"mkdir -p /logs/verifier && echo '{ctrf}' > /logs/verifier/ctrf.json",)),
        options(),
    )
    assert not record.resolved and record.total == 2 and record.passed == 0


async def test_bundled_task_with_a_real_environment(daytona):
    from termgym.tasks.bundled import bundled_task_path

    path = bundled_task_path("archives/package-logs")
    assert path is not None
    task = load_task(path)
    record = await run_trial(task, OracleAgent(), options())
    assert record.error is None and record.resolved, record.logs


def test_missing_credentials_is_one_line_naming_the_variables(monkeypatch, tmp_path):
    for name in ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN", "DAYTONA_ORGANIZATION_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BackendUnavailable) as caught:
        preflight("daytona")
    message = str(caught.value)
    assert "\n" not in message and "DAYTONA_API_KEY" in message and "DAYTONA_API_URL" in message
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("DAYTONA_")}
    task = write_task(tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "termgym", "check", str(task), "--backend", "daytona"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and "DAYTONA_API_KEY" in result.stderr and "Traceback" not in result.stderr


async def test_rejected_credentials_fail_the_trial_with_a_record(task_dir, daytona):
    daytona.api_key = "another-key"
    record = await run_trial(load_task(task_dir), OracleAgent(), options())
    assert record.error is not None, record
    assert record.error["kind"] == "sandbox_error" and "DAYTONA_API_KEY" in record.error["message"]


async def test_shell_survives_the_daemons_input_fifo_race(task_dir, daytona):
    """The daemon's background writer of a command's input FIFO can open it after the first input
    was written and closed; the shell must not read end-of-file and exit then."""
    daytona.faults.input_keeper_delay = 1.0
    from termgym.env import AsyncTerminalEnv

    async with AsyncTerminalEnv(load_task(task_dir), options()) as env:
        await env.reset()
        await asyncio.sleep(1.5)  # the first input has long been read; the keeper opens only now
        obs, _, _, _, info = await env.step("echo still here")
        assert obs == "still here\n" and not info["shell_restarted"]


async def test_without_snapshot_rights_sandboxes_are_built_from_the_dockerfile(task_dir, daytona):
    daytona.faults.storms.append(("POST", r"^/api/snapshots$", 403, 100))
    record = await run_trial(load_task(task_dir), OracleAgent(), options())
    assert record.error is None and record.resolved
    (body,) = daytona.create_bodies
    assert "snapshot" not in body or body["snapshot"] is None
    assert body["buildInfo"]["dockerfileContent"].startswith("FROM debian:bookworm-slim")
    assert (body["cpu"], body["memory"], body["disk"]) == (1, 2, 10)


async def test_snapshot_build_errors_that_persist_end_the_trial(task_dir, daytona):
    daytona.faults.storms.append(("POST", r"^/api/snapshots$", 503, 100))
    record = await run_trial(load_task(task_dir), OracleAgent(), options())
    assert record.error is not None, record
    assert record.error["kind"] == "sandbox_error" and "snapshot" in record.error["message"]
    assert not daytona.create_times


async def test_task_with_a_prebuilt_image_only(tmp_path, daytona):
    task_dir = write_task(tmp_path)
    (task_dir / "environment" / "Dockerfile").unlink()
    toml = (
        (task_dir / "task.toml")
        .read_text()
        .replace("[environment]\n", '[environment]\ndocker_image = "debian:bookworm-slim"\n')
    )
    (task_dir / "task.toml").write_text(toml)
    record = await run_trial(
        load_task(task_dir), ScriptedAgent(("mkdir -p /app && echo done > /app/result.txt",)), options()
    )
    assert record.error is None and record.resolved
    (snapshot,) = daytona.snapshots.values()
    assert snapshot["imageName"] == "debian:bookworm-slim"


def _task_with_image_and_dockerfile(tmp_path):
    """A task naming ``debian:bookworm-slim`` whose Dockerfile fails to build: only a sandbox made
    from the image reference can run it."""
    return load_task(
        write_task(
            tmp_path,
            dockerfile="FROM debian:bookworm-slim\nRUN exit 9\n",
            environment_toml='docker_image = "debian:bookworm-slim"\n',
        )
    )


async def test_a_named_image_wins_over_the_dockerfile_as_an_image_reference(tmp_path, daytona):
    task = _task_with_image_and_dockerfile(tmp_path)
    record = await run_trial(task, ScriptedAgent(("mkdir -p /app && echo done > /app/result.txt",)), options())
    assert record.error is None and record.resolved, record
    (_build,) = [r for r in daytona.requests if r.method == "POST" and r.path == "/api/snapshots"]
    (snapshot,) = daytona.snapshots.values()
    assert snapshot["imageName"] == "debian:bookworm-slim" and snapshot["dockerfile"] is None
    assert record.image == {"ref": "debian:bookworm-slim", "source": "docker_image"}


async def test_build_makes_the_snapshot_from_the_dockerfile(tmp_path, daytona):
    record = await run_trial(_task_with_image_and_dockerfile(tmp_path), NullAgent(), options(build=True))
    assert record.error is not None and record.error["kind"] == "build_failed", record
    (snapshot,) = daytona.snapshots.values()
    assert snapshot["imageName"] is None and "RUN exit 9" in snapshot["dockerfile"]


async def test_without_snapshot_rights_a_named_image_is_the_sandboxes_base(tmp_path, daytona):
    daytona.faults.storms.append(("POST", r"^/api/snapshots$", 403, 100))
    task = _task_with_image_and_dockerfile(tmp_path)
    record = await run_trial(task, ScriptedAgent(("mkdir -p /app && echo done > /app/result.txt",)), options())
    assert record.error is None and record.resolved, record
    (body,) = daytona.create_bodies
    assert body["buildInfo"]["dockerfileContent"].strip() == "FROM debian:bookworm-slim"
    assert any("creating from image debian:bookworm-slim instead" in w for w in record.warnings)
