"""The real mini-swe-agent (PyPI, pinned) driving termgym sandboxes through the recording gateway,
against a scripted OpenAI-compatible server (``fault_server``): its own loop, prompts, tool-call
parsing, litellm client and retry policy, unchanged. Embedded backend here; Docker in
``test_mini_swe_agent_docker.py``; a real ``vllm serve`` in ``test_gateway_vllm.py``."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from termgym.agents import ModelConfig
from termgym.episode.options import EnvOptions
from termgym.integrations.harness import HarnessAgent
from termgym.integrations.settings import build_harness_agent
from termgym.records import TrialRecord
from termgym.tasks.bundled import resolve_task
from termgym.transcript import read_transcript
from termgym.trial import run_trial
from tests.termgym.agents.fault_server import MODEL, FaultServer, Reply, hang, server_error, tool_call

pytest.importorskip("minisweagent", reason="the harnesses extra")
pytestmark = pytest.mark.usefixtures("no_leaks")

TASK = "file-ops/bulk-rename"
SOLUTION = Path(__file__).resolve().parents[3] / "envs" / TASK / "solution" / "solve.sh"
SUBMIT = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
BOUND = 60.0


def bash(command: str) -> Reply:
    """A reply calling mini-swe-agent's ``bash`` tool."""
    return tool_call("bash", {"command": command})


@pytest.fixture
async def server():
    async with FaultServer() as running:
        yield running


def harness(server: FaultServer, **kw: Any) -> HarnessAgent:
    agent = build_harness_agent("mini-swe-agent", ModelConfig(model=MODEL, base_url=server.base_url), environ={}, **kw)
    assert isinstance(agent, HarnessAgent)
    return agent


async def trial(
    agent: HarnessAgent, tmp_path: Path, *, task: str = TASK, bound: float = BOUND, **options: Any
) -> TrialRecord:
    try:
        return await asyncio.wait_for(
            run_trial(resolve_task(task), agent, EnvOptions(trials_dir=str(tmp_path / "trials"), **options)), bound
        )
    finally:
        await agent.aclose()


def transcript(record: TrialRecord) -> dict[str, Any]:
    assert record.transcript is not None
    return read_transcript(record.transcript)


async def test_reference_commands_through_the_harness_resolve_the_task_and_every_call_is_recorded(
    server, tmp_path, backend
):
    server.add(bash(f"bash {SOLUTION.parent}/solve.sh"))  # a path the sandbox cannot see: fails, exit 127
    server.add(bash(SOLUTION.read_text()), bash("ls /app/reports"), bash(SUBMIT))
    record = await trial(harness(server), tmp_path, backend=backend, bound=300 if backend == "docker" else BOUND)
    assert record.backend == backend
    assert record.error is None, record.error
    assert record.resolved and record.reward > 0
    assert record.agent == "mini-swe-agent" and record.stop_reason == "submitted"
    data = transcript(record)
    # every command mini-swe-agent ran is a turn of the sandbox; the submit too
    kinds = [t["action"]["kind"] for t in data["turns"]]
    assert kinds == ["command", "command", "command", "command", "submit"]
    assert data["turns"][0]["result"]["exit_code"] != 0
    listing = data["turns"][2]["result"]["output"]
    assert "2024-01-15_sales.csv" in listing and "sales_report_2024" not in listing
    # the harness's own messages: mini-swe-agent's system prompt, the task, its exit
    messages = data["harness"]["messages"]
    assert data["harness"]["exit_status"] == "Submitted"
    assert messages[0]["role"] == "system" and "Rename every file" in messages[1]["content"]
    assert messages[-1]["role"] == "exit"
    # the gateway saw four calls, each forwarded with the token fields asked for
    chats = server.requests_to("chat/completions")
    assert len(chats) == len(data["calls"]) == 4
    assert all(r.body["return_token_ids"] is True and r.body["logprobs"] is True for r in chats)
    assert [c["status"] for c in data["calls"]] == [200] * 4
    # mini-swe-agent's tool, not termgym's
    assert [t["function"]["name"] for t in chats[0].body["tools"]] == ["bash"]
    # its observation of the failed first command reached the model in the second request
    assert any(m.get("role") == "tool" and "127" in str(m.get("content")) for m in chats[1].body["messages"])
    # the fake server renders chat by text: every prompt extends the last one, one sample
    assert len(data["segments"]) == 1
    segment = data["segments"][0]
    assert segment["bridges"] == 3 and segment["bridge_breaks"] == 0
    assert sum(segment["mask"]) == sum(len(c["completion_ids"]) for c in data["calls"])


async def test_each_action_runs_in_a_fresh_subshell_at_the_working_directory(server, tmp_path):
    server.add(bash("cd /tmp && export FOO=bar && pwd"), bash('pwd; echo "[${FOO:-unset}]"'), bash(SUBMIT))
    record = await trial(harness(server), tmp_path)
    turns = transcript(record)["turns"]
    assert turns[0]["result"]["output"].strip() == "/tmp"
    second = turns[1]["result"]["output"]
    assert "[unset]" in second and "/tmp" not in second  # neither the cd nor the export carried over


async def test_the_turn_budget_ends_the_harness_and_the_episode_is_verified(server, tmp_path):
    server.script.default = bash("echo again")
    record = await trial(harness(server, max_turns=3), tmp_path, max_turns=3)
    assert record.stop_reason == "max_turns" and record.turns == 3
    assert record.total > 0  # verified
    assert transcript(record)["harness"]["exit_status"] == "LimitsExceeded"


async def test_an_upstream_that_keeps_failing_is_a_model_error_not_a_hang(server, tmp_path, monkeypatch):
    monkeypatch.setenv("MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT", "2")
    server.add(server_error(500, count=10))
    record = await trial(harness(server), tmp_path, bound=90)
    assert record.error is not None and record.error["kind"] == "model_error"
    assert record.stop_reason == "model_error"
    calls = transcript(record)["calls"]
    # litellm's client retries twice under each of mini-swe-agent's two attempts; the gateway never retries
    assert len(calls) == len(server.requests_to("chat/completions")) == 6
    assert {c["status"] for c in calls} == {500}


async def test_a_hung_upstream_ends_at_the_agent_timeout(server, tmp_path):
    server.add(bash("echo first"), hang())
    record = await trial(harness(server), tmp_path, bound=40, agent_timeout=4.0)
    assert record.stop_reason == "agent_timeout"
    data = transcript(record)
    assert data["harness"]["gateway_end"] == "deadline"
    assert data["calls"][-1]["status"] == 404


async def test_the_teacher_and_a_rewritten_history_count_breaks(tmp_path):
    """Unit of the pure rule, through the gateway's record: a prompt that does not extend the last
    prompt and completion starts a new segment (tests/termgym/gateway covers the rule itself)."""
    from termgym.gateway.calls import Call, merge_calls

    calls = [
        Call(0, "/chat/completions", {}, 200, prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.5]),
        Call(1, "/chat/completions", {}, 200, prompt_ids=[1, 2, 3, 4], completion_ids=[5], logprobs=[-0.1]),
        Call(2, "/chat/completions", {}, 200, prompt_ids=[9, 9], completion_ids=[6], logprobs=[-0.2]),
    ]
    merged = merge_calls(calls)
    assert merged.breaks == 1 and len(merged.segments) == 2
    assert merged.segments[0].ids == [1, 2, 3, 4, 5] and merged.segments[0].mask == [0, 0, 1, 0, 1]
    assert json.dumps(merged.segments[1].ids) == "[9, 9, 6]"


def test_the_environment_class_runs_a_users_own_mini_swe_agent_in_a_termgym_sandbox(no_leaks):
    """``environment_class: termgym.integrations.mini_swe_agent.TermgymEnvironment`` as
    mini-swe-agent's own loader builds it from a config: commands in the task's sandbox, the submit
    verified, the reward in the exit message, the sandbox gone after ``close``."""
    from minisweagent.environments import get_environment
    from minisweagent.exceptions import LimitsExceeded, Submitted

    environment: Any = get_environment(
        {"environment_class": "termgym.integrations.mini_swe_agent.TermgymEnvironment", "task": TASK, "timeout": 20}
    )
    try:
        assert "Rename every file" in environment.instruction
        assert environment.get_template_vars()["system"] == "Linux"
        listing = environment.execute({"command": "ls"}, cwd="/app/reports")
        assert listing["returncode"] == 0 and "sales_report_20240115.csv" in listing["output"]
        slow = environment.execute({"command": "sleep 5"}, timeout=1)
        assert slow["returncode"] == -1 and "timed out after 1 seconds" in slow["exception_info"]
        assert environment.execute({"command": SOLUTION.read_text()})["returncode"] == 0
        with pytest.raises(Submitted) as submitted:
            environment.execute({"command": SUBMIT})
        (exit_message,) = submitted.value.messages
        assert exit_message["extra"]["exit_status"] == "Submitted"
        assert exit_message["extra"]["termgym"]["resolved"] is True and exit_message["extra"]["termgym"]["reward"] > 0
    finally:
        environment.close()
    environment.close()  # twice: nothing to do
    with pytest.raises(LimitsExceeded):  # the episode is over: the harness is told so
        environment.execute({"command": "ls"})
