"""termgym as a SkyRL-gym environment, through the real ``skyrl-gym`` package (PyPI, pinned in the
``integrations`` extra): the registered id, SkyRL's synchronous calls, its dataset rows, on the
embedded backend and on Docker; the reward is the one ``termgym check`` gives for the same commands."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import KILL_THE_KEEPER, REPO_ROOT, sandbox_processes, termgym, termgym_containers

skyrl_gym = pytest.importorskip("skyrl_gym", reason="the integrations extra")
from termgym.integrations import skyrl  # noqa: E402  (registers the id)

pytestmark = pytest.mark.usefixtures("no_leaks")

TASK = "file-ops/bulk-rename"
SOLUTION = (REPO_ROOT / "envs" / TASK / "solution" / "solve.sh").read_text()


def block(command: str, prose: str = "") -> str:
    return f"{prose}\n```bash\n{command}\n```\n"


def hermes(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def check(task: str, agent: str, backend: str) -> dict[str, Any]:
    """The record ``termgym check`` prints for ``task`` with ``agent``."""
    result = termgym("check", task, "--agent", agent, "--backend", backend, "--json", timeout=600)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def episode(replies: list[str], **extras: Any) -> tuple[list[dict[str, Any]], Any]:
    """Make, init and step ``termgym`` through SkyRL-gym until done (or out of replies); every
    step's output, and the closed environment."""
    env = skyrl_gym.make("termgym", env_config={"max_turns": 6}, extras={"task": TASK, **extras})
    outputs = []
    try:
        env.init([])
        for reply in replies:
            outputs.append(env.step(reply))
            if outputs[-1]["done"]:
                break
    finally:
        env.close()
    return outputs, env


@pytest.mark.slow
def test_the_reference_commands_earn_what_termgym_check_gives_and_so_does_submitting_at_once(backend):
    outputs, env = episode(
        [block("ls /app/reports | head -3", "Let me look."), block(SOLUTION), block(":submit")], backend=backend
    )
    assert [o["done"] for o in outputs] == [False, False, True]
    assert [o["reward"] for o in outputs[:2]] == [0.0, 0.0]
    assert outputs[0]["observations"][0]["role"] == "user"
    assert outputs[0]["observations"][0]["content"].startswith("Exit code: 0\n")
    assert "sales_report_" in outputs[0]["observations"][0]["content"]
    final, oracle = outputs[-1], check(TASK, "oracle", backend)
    assert final["reward"] == oracle["reward"] > 0
    meta = final["metadata"]
    assert meta["resolved"] == 1 and meta["stop_reason"] == "submitted" and meta["error"] is None
    assert (meta["passed"], meta["total"]) == (oracle["passed"], oracle["total"])
    assert len(meta["assertions"]) == oracle["total"] and all(a["passed"] for a in meta["assertions"])
    assert env.get_metrics() == {"turns": 3, "reward": oracle["reward"], "resolved": 1, "passed": 5, "total": 5}

    outputs, _ = episode([block(":submit")], backend=backend)
    null = check(TASK, "null", backend)
    assert outputs[-1]["done"] and outputs[-1]["reward"] == null["reward"]
    assert 0 < null["reward"] < oracle["reward"]  # a partial reward: some assertions pass untouched
    assert outputs[-1]["metadata"]["resolved"] == 0


def test_the_tool_format_reads_hermes_calls_from_the_model_text():
    outputs, _ = episode(
        [
            "<think>look first</think>" + hermes("bash", {"command": "cd /app/reports && pwd"}),
            hermes("bash", {"command": SOLUTION, "timeout": 60}),
            hermes("submit", {}),
        ],
        action_format="tool",
    )
    assert outputs[0]["observations"] == [{"role": "tool", "content": "Exit code: 0\n/app/reports\n"}]
    assert outputs[-1]["done"] and outputs[-1]["metadata"]["resolved"] == 1


def test_replies_that_do_not_parse_end_the_episode_verified_after_max_parse_errors():
    outputs, _ = episode(["no block here", block("ls", "one") + block("ls", "two"), "```bash\n\n```"])
    first, second, last = outputs
    assert "no fenced shell block" in first["observations"][0]["content"]
    assert "2 fenced shell blocks" in second["observations"][0]["content"]
    assert last["done"] and last["metadata"]["stop_reason"] == "parse_errors"
    assert last["metadata"]["total"] == 5  # verified, as the model agent's truncations are


def test_the_turn_budget_counts_every_reply_and_ends_the_episode_verified():
    replies = [block("true"), "not an action", block("true")]
    outputs, _ = episode(replies, max_turns=3)
    assert [o["done"] for o in outputs] == [False, False, True]
    assert outputs[-1]["metadata"]["stop_reason"] == "max_turns" and outputs[-1]["metadata"]["total"] == 5


def test_a_sandbox_the_agent_kills_ends_the_episode_with_reward_zero_and_its_error():
    outputs, _ = episode([block(f"{KILL_THE_KEEPER}; sleep 5")])
    last = outputs[-1]
    assert last["done"] and last["reward"] == 0.0
    assert last["metadata"]["error"]["kind"] == "broken_by_agent"


def test_the_dataset_rows_name_the_env_and_make_it_from_their_extras(tmp_path, task_dir):
    path = skyrl.write_dataset([TASK, str(task_dir)], tmp_path / "data" / "train.parquet", max_turns=4)
    import pandas

    rows = pandas.read_parquet(path).to_dict("records")
    assert [row["task"] for row in rows] == [TASK, str(task_dir.resolve())]
    assert {row["env_class"] for row in rows} == {"termgym"} and rows[0]["max_turns"] == 4
    assert [m["role"] for m in rows[0]["prompt"]] == ["system", "user"]
    assert rows[0]["prompt"][1]["content"].startswith("The directory `/app/reports`")
    row = rows[1]
    extras = {key: value for key, value in row.items() if key not in ("prompt", "env_class")}
    env = skyrl_gym.make(row["env_class"], env_config={}, extras=extras)
    try:
        prompt, info = env.init(list(row["prompt"]))
        assert prompt[1]["content"] == "Write the word done into /app/result.txt."
        assert info["backend"] == "local" and env.max_turns == 4
        assert env.step(block("echo done > /app/result.txt"))["done"] is False
        final = env.step(block(":submit"))
    finally:
        env.close()
    assert final["metadata"]["resolved"] == 1 and final["metadata"]["passed"] == 2


@pytest.mark.parametrize(
    ("env_config", "extras", "said"),
    [
        ({}, {"task": "no/such-task"}, "task directory does not exist"),
        ({}, {}, "termgym needs a task"),
        ({"max_turn": 3}, {"task": TASK}, "unknown key(s) max_turn"),
        ({}, {"task": TASK, "max_turns": "many"}, "max_turns: expected an integer"),
        ({}, {"task": TASK, "action_format": "xml"}, "action_format must be one of tool, text"),
        ({}, {"task": TASK, "backend": "nowhere"}, "unknown backend 'nowhere'"),
        ({}, {"task": TASK, "max_turns": 0}, "max_turns"),
        ({}, {"task": TASK, "max_turns": True}, "max_turns: expected an integer, got True"),
        ({"agent_timeout": "soon"}, {"task": TASK}, "agent_timeout: expected a number"),
        ({}, {"task": 7}, "task: expected a string"),
    ],
)
def test_bad_input_is_one_skyrl_error_line_before_any_sandbox(env_config, extras, said):
    with pytest.raises(skyrl_gym.error.Error) as caught:
        skyrl_gym.make("termgym", env_config=env_config, extras=extras)
    assert isinstance(caught.value, skyrl.TermgymEnvError)
    assert said in str(caught.value) and "\n" not in str(caught.value)


def test_an_unavailable_backend_is_one_skyrl_error_line(monkeypatch):
    for name in ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN", "DAYTONA_API_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", "/nonexistent")
    with pytest.raises(skyrl.TermgymEnvError, match="daytona") as caught:
        skyrl_gym.make("termgym", extras={"task": TASK, "backend": "daytona"})
    assert "\n" not in str(caught.value)


def test_steps_out_of_order_are_skyrl_errors():
    env = skyrl_gym.make("termgym", extras={"task": TASK})
    with pytest.raises(skyrl.TermgymEnvError, match="call init"):
        env.step(block("ls"))
    env.init([])
    with pytest.raises(skyrl.TermgymEnvError, match="init\\(\\) called twice"):
        env.init([])
    env.step(block(":submit"))
    with pytest.raises(skyrl.TermgymEnvError, match="without a running episode"):
        env.step(block("ls"))
    env.close()
    env.close()  # idempotent


def test_calls_from_many_threads_share_one_loop_and_run_concurrently(task_dir):
    from concurrent.futures import ThreadPoolExecutor

    def one(index: int) -> float:
        env = skyrl_gym.make("termgym", extras={"task": str(task_dir)})
        try:
            env.init([])
            env.step(block(f"sleep 1; echo done > /app/result.txt; echo {index}"))
            return env.step(block(":submit"))["metadata"]["resolved"]
        finally:
            env.close()

    started = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        resolved = list(pool.map(one, range(4)))
    assert resolved == [1, 1, 1, 1]
    assert time.monotonic() - started < 4 * 1.0 + 3.0  # the four sleeps overlapped


SCRIPT = textwrap.dedent("""\
    import sys, skyrl_gym
    import termgym.integrations.skyrl
    env = skyrl_gym.make("termgym", extras={"task": sys.argv[1], "backend": sys.argv[2]})
    env.init([])
    print("started", flush=True)
    if sys.argv[3] == "hang":
        env.step("```bash\\nsleep 600\\n```")
    """)


def _start(tmp_path: Path, backend: str, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "episode.py"
    script.write_text(SCRIPT)
    process = subprocess.Popen(
        [sys.executable, str(script), TASK, backend, mode],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "started"
    return process


def test_an_environment_never_closed_is_closed_at_interpreter_exit(tmp_path, backend):
    with _start(tmp_path, backend, "exit") as process:
        assert process.wait(timeout=120) == 0
    # the no_leaks fixture checks the sandbox is gone, on disk, running, or as a container


def test_a_killed_skyrl_process_leaves_what_termgym_gc_removes(tmp_path, backend):
    with _start(tmp_path, backend, "hang") as process:
        time.sleep(1)
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
    result = termgym("gc", "--backend", backend, timeout=300)
    assert result.returncode == 0, result.stderr
    assert not [line for line in sandbox_processes() if str(os.environ["TERMGYM_SANDBOX_DIR"]) in line]
    if backend == "docker":
        assert not termgym_containers()


def test_settings_come_from_skyrls_omegaconf_env_config_and_the_row_extras_win():
    from omegaconf import OmegaConf

    config = OmegaConf.create({"max_turns": 4, "action_format": "tool", "agent_timeout": 30})
    settings = skyrl.read_settings(config, {"task": TASK, "max_turns": 7, "reward_spec": {"method": "x"}})
    assert (settings.task, settings.max_turns, settings.action_format) == (TASK, 7, "tool")
    assert settings.agent_timeout == 30.0 and settings.env_options().agent_timeout == 30.0
    import numpy

    assert skyrl.read_settings(None, {"task": TASK, "max_turns": numpy.int64(5)}).max_turns == 5  # from parquet


def test_the_example_env_loop_runs_as_the_docs_show(tmp_path):
    """examples/skyrl_env_loop.py, as docs/guides/frameworks.md shows it: two bundled tasks, each
    resolved through the registered id from its dataset row."""
    dataset = tmp_path / "train.parquet"
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / "skyrl_env_loop.py"), "--dataset", str(dataset)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO_ROOT,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == f"dataset: {dataset} (2 rows)"
    assert lines[1].startswith("termgym/file-ops/bulk-rename: reward 0.25, resolved 1, 5/5 assertions")
    assert lines[2].startswith("termgym/text-processing/word-frequency: reward 0.30, resolved 1, 6/6 assertions")
    assert all(line.endswith("stop submitted, 3 turns on local") for line in lines[1:])
