"""termgym as an inspect-ai sandbox provider and scorer, through the real ``inspect-ai`` package (PyPI,
pinned in the ``integrations`` extra): ``inspect eval`` (its CLI) of the example eval with inspect's
scripted ``mockllm`` model, the provider's sandbox API on the embedded backend and on Docker, bad
input, and ``inspect sandbox cleanup termgym`` after a killed eval."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import KILL_THE_KEEPER, REPO_ROOT, sandbox_processes, termgym, termgym_containers, write_task

pytest.importorskip("inspect_ai", reason="the integrations extra")
from inspect_ai.log import read_eval_log
from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
)
from inspect_ai.util._sandbox.limits import override_max_exec_output_size, override_max_read_file_size

from termgym.integrations.inspect import (
    TermgymSandboxConfig,
    TermgymSandboxEnvironment,
    clean_up,
    read_config,
)

pytestmark = pytest.mark.usefixtures("no_leaks")

TASK = "file-ops/bulk-rename"
INSPECT = str(Path(sys.executable).parent / "inspect")


def inspect_cli(*args: str, cwd: Path = REPO_ROOT, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([INSPECT, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


def eval_log(log_dir: Path) -> Any:
    logs = sorted(log_dir.glob("*.eval"))
    assert len(logs) == 1, logs
    return read_eval_log(str(logs[0]))


def check(task: str, agent: str, backend: str) -> dict[str, Any]:
    result = termgym("check", task, "--agent", agent, "--backend", backend, "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


# -- inspect eval, the example ---------------------------------------------------------------------


@pytest.mark.slow
def test_the_example_eval_resolves_with_the_reference_solution_and_not_without(tmp_path, backend):
    for solve, agent in (("true", "oracle"), ("false", "null")):
        log_dir = tmp_path / solve
        result = inspect_cli(
            "eval", "examples/inspect_eval.py", "--display", "plain", "--log-dir", str(log_dir),
            "-T", f"backend={backend}", "-T", f"solve={solve}",
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
        log = eval_log(log_dir)
        assert log.status == "success", log.error
        (sample,) = log.samples
        score = sample.scores["termgym_scorer"]
        expected = check(TASK, agent, backend)
        assert score.value == {"resolved": int(expected["resolved"]), "reward": expected["reward"]}
        assert score.metadata["passed"] == expected["passed"] and score.metadata["total"] == expected["total"]
        assert len(score.metadata["assertions"]) == expected["total"]
        assert score.metadata["stop_reason"] == "submitted" and score.metadata["error"] is None
        tool_output = [m.text for m in sample.messages if m.role == "tool"]
        assert "sales_report_20240115.csv" in tool_output[0]  # the agent's bash ran in the task's sandbox


TOOLS_EVAL = textwrap.dedent("""\
    import sys
    from inspect_ai import Task, task
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.solver import basic_agent
    from inspect_ai.tool import bash_session, text_editor
    from termgym.integrations.inspect import termgym_samples, termgym_scorer

    @task
    def tools(task_dir: str, backend: str = "local"):
        calls = [
            ("text_editor", {"command": "create", "path": "/app/result.txt", "file_text": "done\\n"}),
            ("bash_session", {"action": "type_submit", "input": "cat /app/result.txt"}),
            ("submit", {"answer": "done"}),
        ]
        outputs = [ModelOutput.for_tool_call("mockllm/model", name, arguments) for name, arguments in calls]
        for output in outputs:
            output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return Task(
            dataset=termgym_samples([task_dir], backend=backend),
            solver=basic_agent(tools=[text_editor(), bash_session()]),
            scorer=termgym_scorer(),
            model=get_model("mockllm/model", custom_outputs=outputs),
        )
    """)


@pytest.mark.slow
def test_inspects_injected_tools_run_in_a_termgym_sandbox(tmp_path, task_dir, backend):
    """text_editor and bash_session: inspect copies its tool binary in (write_file, 14 MB) and runs
    it as root behind exec_remote; the scorer then grades what they did."""
    (tmp_path / "tools.py").write_text(TOOLS_EVAL)
    args = ["-T", f"task_dir={task_dir}", "-T", f"backend={backend}"]
    result = inspect_cli("eval", "tools.py", "--display", "plain", "--log-dir", "logs", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    log = eval_log(tmp_path / "logs")
    assert log.status == "success", log.error
    (sample,) = log.samples
    tool_output = [m.text for m in sample.messages if m.role == "tool"]
    assert tool_output[0].startswith("File created successfully") and "done" in tool_output[1]
    assert sample.scores["termgym_scorer"].value["resolved"] == 1


# -- the sandbox API -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def started(task: str | Path, backend: str) -> AsyncIterator[TermgymSandboxEnvironment]:
    """A sample's sandbox of ``task`` on ``backend``, as inspect makes one; cleaned up after the block."""
    config = TermgymSandboxConfig(task=str(task), backend=backend)
    await TermgymSandboxEnvironment.task_init("test", config)
    environments = await TermgymSandboxEnvironment.sample_init("test", config, {})
    box = environments["default"].as_type(TermgymSandboxEnvironment)
    try:
        yield box
    finally:
        await TermgymSandboxEnvironment.sample_cleanup("test", None, {"default": box}, False)


async def test_exec_keeps_streams_apart_and_takes_input_cwd_env_and_path_as_inspect_documents(task_dir, backend):
    async with started(task_dir, backend) as box:
        await exercise_exec(box)


async def exercise_exec(box: TermgymSandboxEnvironment) -> None:
    result = await box.exec(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert (result.success, result.returncode, result.stdout, result.stderr) == (False, 3, "out\n", "err\n")
    assert (await box.exec(["cat"], input="line one\nline two")).stdout == "line one\nline two"
    assert (await box.exec(["wc", "-c"], input=b"\x00\xff\x01")).stdout.strip() == "3"
    assert (await box.exec(["pwd"])).stdout == "/app\n"
    await box.exec(["mkdir", "-p", "sub/dir"])
    assert (await box.exec(["pwd"], cwd="sub/dir")).stdout == "/app/sub/dir\n"
    assert (await box.exec(["sh", "-c", 'echo "$FOO"'], env={"FOO": "bar baz"})).stdout == "bar baz\n"
    assert (await box.exec(["sh", "-c", "umask"])).stdout == "0022\n"  # not the wrapper's private 077
    missing = await box.exec(["no-such-command"])
    assert missing.returncode == 127 and not missing.success
    assert (await box.exec(["true"])).stdout == ""
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await box.exec(["sleep", "30"], timeout=1)
    assert time.monotonic() - started < 15
    assert await termgym_files(box) == [".termgym-exec-"]  # the timed-out command's files went too
    with override_max_exec_output_size(1000):
        with pytest.raises(OutputLimitExceededError) as caught:
            await box.exec(["sh", "-c", "head -c 5000 /dev/zero | tr '\\0' x"])
        assert caught.value.truncated_output == "x" * 1000
        assert (await box.exec(["sh", "-c", "head -c 1000 /dev/zero | tr '\\0' y"])).stdout == "y" * 1000


async def test_files_are_written_and_read_as_text_and_bytes_with_inspects_errors(task_dir, backend):
    async with started(task_dir, backend) as box:
        await exercise_files(box)


async def exercise_files(box: TermgymSandboxEnvironment) -> None:
    await box.write_file("notes/a.txt", "first\r\nsecond\n")
    assert await box.read_file("/app/notes/a.txt") == "first\r\nsecond\n"  # relative to the workdir; CRLF kept
    blob = bytes(range(256)) * 3
    await box.write_file("/tmp/deep/er/blob.bin", blob)
    assert await box.read_file("/tmp/deep/er/blob.bin", text=False) == blob
    assert (await box.exec(["wc", "-c", "/tmp/deep/er/blob.bin"])).stdout.split()[0] == "768"
    with pytest.raises(UnicodeDecodeError):
        await box.read_file("/tmp/deep/er/blob.bin")
    with pytest.raises(FileNotFoundError):
        await box.read_file("/app/nothing-here")
    with pytest.raises(IsADirectoryError):
        await box.read_file("/app/notes")
    with pytest.raises(IsADirectoryError):
        await box.write_file("/app/notes", "x")
    with override_max_read_file_size(10):
        with pytest.raises(OutputLimitExceededError):
            await box.read_file("/app/notes/a.txt")
    # staged input and the earlier commands' wrapper files are gone: only the listing's own is there
    assert await termgym_files(box) == [".termgym-exec-"]


async def termgym_files(box: TermgymSandboxEnvironment) -> list[str]:
    """What termgym left under /tmp, as name prefixes (the listing command's own wrapper included)."""
    listing = await box.exec(["sh", "-c", "ls -a /tmp | grep -e '^.termgym-exec' -e '^.termgym-stage' || true"])
    return sorted({name[: name.index("-", 9) + 1] for name in listing.stdout.split()})


async def test_the_provider_runs_on_daytona_through_its_sdk(daytona, task_dir):
    """The Daytona backend, the real SDK over HTTP against the local API server (each sandbox there a
    real embedded sandbox): the same exec and file behaviour, and the scorer's verification."""
    async with started(task_dir, "daytona") as box:
        await exercise_exec(box)
        await exercise_files(box)
        await box.exec(["sh", "-c", "echo done > /app/result.txt"])
        assert (await box.verify())["resolved"] == 1


async def test_users_as_the_backend_allows(task_dir, backend):
    async with started(task_dir, backend) as box:
        assert (await box.exec(["id", "-u"], user="root")).stdout == "0\n"
        if backend == "local":
            with pytest.raises(SandboxUserUnsupportedError):
                await box.exec(["id", "-u"], user="nobody")
        else:
            assert (await box.exec(["id", "-un"], user="nobody")).stdout == "nobody\n"


@pytest.mark.docker
async def test_a_task_agent_user_is_the_default_user_and_permissions_are_inspects_errors(tmp_path, no_leaks):
    from tests.helpers import require_docker

    require_docker()
    task = write_task(tmp_path)
    toml = task / "task.toml"
    toml.write_text(toml.read_text().replace("[agent]\n", '[agent]\nuser = "nobody"\n'))
    async with started(task, "docker") as box:
        assert (await box.exec(["id", "-un"])).stdout == "nobody\n"
        with pytest.raises(PermissionError):
            await box.write_file("/root/owned-by-root", "x")
        with pytest.raises(PermissionError):
            await box.read_file("/etc/shadow")
        await box.write_file("/tmp/mine", "x")
        assert (await box.exec(["stat", "-c", "%U", "/tmp/mine"])).stdout == "nobody\n"


async def test_the_scorer_path_verifies_once_and_the_sandbox_is_then_unavailable(task_dir, backend):
    async with started(task_dir, backend) as box:
        await box.exec(["sh", "-c", "echo done > /app/result.txt"])
        verdict = await box.verify()
        assert (verdict["resolved"], verdict["passed"], verdict["total"]) == (1, 2, 2)
        assert verdict["stop_reason"] == "submitted" and verdict["reward"] > 0
        assert await box.verify() is verdict
        with pytest.raises(SandboxUnavailableError):
            await box.exec(["true"])


async def test_a_sandbox_that_dies_mid_sample_is_unavailable_and_scores_zero_as_the_agents_doing(task_dir):
    async with started(task_dir, "local") as box:
        with pytest.raises(SandboxUnavailableError):
            await box.exec(["sh", "-c", f"{KILL_THE_KEEPER}; sleep 5"])
        with pytest.raises(SandboxUnavailableError):
            await box.exec(["true"])
        verdict = await box.verify()
        assert verdict["resolved"] == 0 and verdict["reward"] == 0.0
        assert verdict["error"]["kind"] == "broken_by_agent"


# -- configuration and bad input -------------------------------------------------------------------


def test_the_config_is_a_task_or_a_config_object():
    assert read_config("file-ops/bulk-rename") == TermgymSandboxConfig(task="file-ops/bulk-rename")
    assert read_config(TermgymSandboxConfig(task="x", backend="docker")).backend == "docker"
    assert TermgymSandboxEnvironment.config_deserialize({"task": "x", "tamper": "warn"}) == TermgymSandboxConfig(
        task="x", tamper="warn"
    )
    with pytest.raises(ValueError, match="needs a task"):
        read_config(None)
    with pytest.raises(ValueError, match="extra"):
        TermgymSandboxConfig(task="x", bakend="docker")  # type: ignore[call-arg]


BAD_EVAL = textwrap.dedent("""\
    from inspect_ai import Task, task
    from inspect_ai.dataset import Sample
    from inspect_ai.solver import generate
    from termgym.integrations.inspect import TermgymSandboxConfig

    @task
    def bad(task_name: str = "no/such-task", backend: str = "local"):
        config = TermgymSandboxConfig(task=task_name, backend=backend)
        return Task(dataset=[Sample(input="hi")], solver=generate(), sandbox=("termgym", config))
    """)


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "termgym sandbox: "),
        (("-T", f"task_name={TASK}", "-T", "backend=daytona"), "daytona"),
        (("-T", f"task_name={TASK}", "-T", "backend=nowhere"), "unknown backend 'nowhere'"),
    ],
)
def test_a_task_that_cannot_run_fails_the_eval_at_its_start_in_one_line(tmp_path, args, said):
    (tmp_path / "bad.py").write_text(BAD_EVAL)
    env = {key: value for key, value in os.environ.items() if not key.startswith("DAYTONA_")}
    result = subprocess.run(
        [INSPECT, "eval", "bad.py", "--model", "mockllm/model", "--display", "plain", "--log-dir", "logs", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**env, "HOME": str(tmp_path)},
    )
    assert result.returncode != 0
    lines = [line for line in (result.stdout + result.stderr).splitlines() if "termgym sandbox" in line]
    assert len(lines) == 1 and said in lines[0], result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


# -- a killed eval ---------------------------------------------------------------------------------

HANGING_EVAL = textwrap.dedent("""\
    from inspect_ai import Task, task
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.solver import basic_agent
    from inspect_ai.tool import bash
    from termgym.integrations.inspect import termgym_samples, termgym_scorer

    @task
    def hangs(backend: str = "local"):
        outputs = [ModelOutput.for_tool_call("mockllm/model", "bash", {"command": "sleep 600"})]
        outputs[0].usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
        return Task(
            dataset=termgym_samples(["file-ops/bulk-rename"], backend=backend),
            solver=basic_agent(tools=[bash(timeout=900)]),
            scorer=termgym_scorer(),
            model=get_model("mockllm/model", custom_outputs=outputs),
        )
    """)


def _sandbox_running(backend: str, sandbox_dir: Path) -> bool:
    if backend == "docker":
        return bool(termgym_containers())
    return any(line for line in sandbox_processes() if "sleep 600" in line or str(sandbox_dir) in line)


@pytest.mark.slow
def test_inspect_sandbox_cleanup_removes_what_a_killed_eval_left(tmp_path, backend, sandbox_dir):
    (tmp_path / "hangs.py").write_text(HANGING_EVAL)
    process = subprocess.Popen(
        [INSPECT, "eval", "hangs.py", "--display", "none", "--log-dir", "logs", "-T", f"backend={backend}"],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (_sandbox_running(backend, sandbox_dir) and _sleeping(backend)):
            assert process.poll() is None, "the eval ended before its sandbox ran the command"
            assert time.monotonic() < deadline, "the eval's sandbox never started"
            time.sleep(0.5)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    assert list(sandbox_dir.glob("tg-*")) or termgym_containers()  # the kill left something behind
    result = inspect_cli("sandbox", "cleanup", "termgym", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{backend}: removed 1 leftover" in result.stdout
    assert not list(sandbox_dir.glob("tg-*")) and not termgym_containers()
    assert not [line for line in sandbox_processes() if str(sandbox_dir) in line]


def _sleeping(backend: str) -> bool:
    return bool(subprocess.run(["pgrep", "-f", "^sleep 600"], capture_output=True).stdout)


async def test_cleanup_of_an_id_no_backend_keeps_is_one_line():
    assert await clean_up("tg-no-such-sandbox") == ["no kept termgym sandbox 'tg-no-such-sandbox' on any backend here"]
