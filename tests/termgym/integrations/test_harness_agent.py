"""The harness agent's guarantees with a harness of the tests' own (``Harness`` is a protocol: any
loop that takes a base URL and the bridge): a harness that neither calls its model nor acts is
stopped at its deadline and the trial ends as ``agent_timeout``; a cancelled trial stops it; the
in-process upstream's rewrite rule and its errors; the command line's one-line errors and
``termgym gateway`` on its own."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import urllib.parse
import urllib.request
from argparse import Namespace
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from termgym.agents.actions import ToolCall
from termgym.agents.client import Completion
from termgym.cli import main
from termgym.cli.gateway import cmd_gateway
from termgym.episode.options import EnvOptions
from termgym.errors import AgentDeadline, ContextExceeded, ModelError
from termgym.gateway import SESSION_HEADER, SessionUpstream
from termgym.gateway.files import session_file_name
from termgym.integrations import harness as harness_module
from termgym.integrations.harness import EnvBridge, HarnessAgent, HarnessResult, HarnessStopped, client_upstream
from termgym.tasks.bundled import resolve_task
from termgym.transcript import Transcript
from termgym.trial import run_trial
from tests.termgym.agents.fault_server import MODEL, FaultServer, text

TASK = "file-ops/bulk-rename"


@dataclass
class BlockedHarness:
    """Runs one command, then waits on ``release`` without calling anything (a stuck harness)."""

    release: threading.Event = field(default_factory=threading.Event)
    name: str = "blocked"
    submit_command: str = "true"
    stepped: list[str] = field(default_factory=list)

    def run(self, base_url: str, model: str, bridge: EnvBridge, instruction: str, info: dict) -> HarnessResult:
        bridge.step("echo started")
        self.stepped.append("echo started")
        self.release.wait(30)
        try:
            bridge.step("echo after")
        except HarnessStopped:
            return HarnessResult("Stopped")
        return HarnessResult("Went on")


@dataclass
class FakeSession:
    """A termgym ``Session`` answering scripted outcomes; records what it was asked."""

    outcomes: list[Any]
    asked: list[list[dict]] = field(default_factory=list)
    segments: list[str] = field(default_factory=list)

    async def complete(self, messages, *, tools, max_tokens, deadline):
        self.asked.append(messages)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def new_segment(self, reason: str) -> None:
        self.segments.append(reason)

    def prompt_tokens(self, messages):
        return None

    def cut_tokens(self, text: str) -> str:
        return text


@dataclass
class FakeClient:
    """A ``ModelClient`` whose sessions are fake ones with nothing scripted (never asked)."""

    model: str = "none"

    def session(self, transcript: Transcript) -> FakeSession:
        return FakeSession([])


def reply(command: str) -> Completion:
    call = ToolCall("call_0", "bash", json.dumps({"command": command}))
    message = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "bash", "arguments": {"command": command}}}
        ],
    }
    return Completion("", [call], "stop", message, prompt_ids=[1, 2], completion_ids=[3], logprobs=[-0.1])


async def test_a_stuck_harness_is_stopped_at_its_deadline_and_the_trial_ends_as_agent_timeout(
    tmp_path, monkeypatch, no_leaks
):
    monkeypatch.setattr(harness_module, "DEADLINE_GRACE", 0.2)
    monkeypatch.setattr(harness_module, "JOIN_GRACE", 0.5)
    stuck = BlockedHarness()
    agent = HarnessAgent(stuck, client_upstream(FakeClient(), 16), "none")
    options = EnvOptions(trials_dir=str(tmp_path / "trials"), agent_timeout=1.0)
    try:
        record = await asyncio.wait_for(run_trial(resolve_task(TASK), agent, options), 30)
    finally:
        stuck.release.set()  # the thread then meets the closed bridge and ends
        await agent.aclose()
    assert record.stop_reason == "agent_timeout" and record.error is not None
    assert record.error["kind"] == "agent_timeout" and record.total > 0  # verified
    data = json.loads(Path(record.transcript or "").read_text())
    assert data["harness"]["exit_status"] == "Unresponsive" and data["harness"]["gateway_end"] == "deadline"
    assert [t["action"].get("command") for t in data["turns"]] == ["echo started"]


async def test_a_cancelled_trial_stops_the_harness_and_leaves_nothing(tmp_path, no_leaks):
    stuck = BlockedHarness()
    agent = HarnessAgent(stuck, client_upstream(FakeClient(), 16), "none")
    trial = asyncio.ensure_future(run_trial(resolve_task(TASK), agent, EnvOptions()))
    while not stuck.stepped:
        await asyncio.sleep(0.05)
    trial.cancel()
    releaser = threading.Timer(0.3, stuck.release.set)  # the harness wakes after the cancellation
    releaser.start()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(trial, 30)
    releaser.join()
    await agent.aclose()
    assert not [t for t in threading.enumerate() if t.name.startswith("harness-")]


async def test_the_in_process_upstream_bridges_an_extension_and_counts_a_rewrite():
    transcript = Transcript()
    session = FakeSession([reply("ls"), reply("pwd"), reply("id")])
    upstream = SessionUpstream(session, transcript, "policy", max_tokens=8)
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    first = await upstream.send("/chat/completions", {"messages": opening, "max_tokens": 99}, 1e12)
    assert first.status == 200 and first.data is not None
    assert first.data["choices"][0]["finish_reason"] == "tool_calls" and first.data["prompt_token_ids"] == [1, 2]
    echoed = first.data["choices"][0]["message"]  # as a harness sends it back: arguments as text
    tool = {"role": "tool", "tool_call_id": "call_0", "content": "out", "extra": {"kept": False}}
    await upstream.send("/chat/completions", {"messages": [*opening, echoed, tool]}, 1e12)
    assert session.asked[1][2] is session.asked[0][-1] or session.asked[1][:2] == session.asked[0][:2]
    assert "extra" not in session.asked[1][3] and session.segments == []
    # the harness drops its history: a new segment, counted on the one it ended
    await upstream.send("/chat/completions", {"messages": [*opening, {"role": "user", "content": "again"}]}, 1e12)
    assert session.segments == ["harness_rewrite"] and transcript.segments[0].bridge_breaks == 1


async def test_the_in_process_upstream_answers_its_errors_as_a_server_would():
    transcript = Transcript()
    session = FakeSession(
        [ContextExceeded("too long", prompt_tokens=900), ModelError("the sampler failed"), AgentDeadline("late")]
    )
    upstream = SessionUpstream(session, transcript, "policy")
    body = {"messages": [{"role": "user", "content": "u"}]}
    assert (await upstream.send("/completions", body, 1e12)).status == 400
    assert (await upstream.send("/chat/completions", {"messages": []}, 1e12)).status == 400
    context = await upstream.send("/chat/completions", body, 1e12)
    assert context.status == 400 and "maximum context length" in (context.error or "")
    assert (await upstream.send("/chat/completions", body, 1e12)).status == 502
    with pytest.raises(AgentDeadline):
        await upstream.send("/chat/completions", body, 1e12)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--agent", "mini-swe-agent", "--model", "m"], "needs --base-url"),
        (["--agent", "mini-swe-agent", "--base-url", "http://127.0.0.1:9/v1"], "needs --model"),
        (
            ["--agent", "mini-swe-agent", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--client", "tokens"],
            "--client: the model agent's settings",
        ),
        (
            ["--agent", "model", "--model", "m", "--agent-config", "tiny"],
            "--agent-config applies to --agent mini-swe-agent only",
        ),
        (
            [
                "--agent",
                "mini-swe-agent",
                "--model",
                "m",
                "--base-url",
                "http://127.0.0.1:9/v1",
                "--agent-config",
                "nope.yaml",
            ],
            "no such file",
        ),
        (
            ["--agent", "mini-swe-agent", "--model", "m", "--base-url", "http://127.0.0.1:9/v1", "--temperature", "3"],
            "temperature must be in [0, 2]",
        ),
    ],
)
def test_bad_harness_flags_are_one_line(argv, said, capsys):
    pytest.importorskip("minisweagent", reason="the harnesses extra")
    assert main(["check", TASK, *argv]) == 2
    err = capsys.readouterr().err
    assert said in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_without_the_extra_the_harness_is_one_line_naming_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "minisweagent", None)  # an import of it fails
    assert (
        main(["check", TASK, "--agent", "mini-swe-agent", "--model", "m", "--base-url", "http://127.0.0.1:9/v1"]) == 2
    )
    assert "pip install -e '.[harnesses]'" in capsys.readouterr().err


async def test_termgym_gateway_records_sessions_and_writes_them_when_stopped(tmp_path, capsys):
    async with FaultServer() as upstream:
        upstream.add(text("hello"))
        args = Namespace(upstream=upstream.base_url, port=0, api_key_env=None, temperature=0.5, out=tmp_path / "gw")
        serving = asyncio.ensure_future(cmd_gateway(args))
        while "termgym gateway on" not in (printed := capsys.readouterr().out):
            await asyncio.sleep(0.05)
        url = printed.split("termgym gateway on ")[1].split(":")[0:3]
        base = ":".join(url).rstrip(",").split(" ")[0]
        body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
        request = urllib.request.Request(
            f"{base}/sessions/run-1/v1/chat/completions", body, {"content-type": "application/json"}
        )
        answer = await asyncio.to_thread(lambda: json.loads(urllib.request.urlopen(request, timeout=10).read()))
        assert answer["choices"][0]["message"]["content"] == "hello"
        assert upstream.requests_to("chat/completions")[0].body["temperature"] == 0.5
        os.kill(os.getpid(), signal.SIGTERM)  # the command's own handler stops it
        assert await asyncio.wait_for(serving, 10) == 0
    written = json.loads((tmp_path / "gw" / "run-1.json").read_text())
    assert written["session"] == "run-1" and [c["status"] for c in written["calls"]] == [200]
    assert written["samples"] and written["samples"][0]["mask"].count(1) == len("hello")


# ids that one file name served before: ``/`` and ``_`` alike, case, ``..``, unicode, cut at 100
COLLIDING_IDS = (
    "run/0001",
    "run_0001",
    "Run_0001",
    "..",
    "../../escaped",
    "ünï/cødé",
    "ünï_cødé",
    "x" * 300,
    "x" * 301,
)


async def test_termgym_gateway_writes_each_session_to_its_own_file_inside_out(tmp_path, capsys):
    out_dir = tmp_path / "runs" / "gw"
    async with FaultServer() as upstream:
        upstream.add(*(text(f"answer {i}") for i in range(2 * len(COLLIDING_IDS))))
        args = Namespace(upstream=upstream.base_url, port=0, api_key_env=None, temperature=None, out=out_dir)
        serving = asyncio.ensure_future(cmd_gateway(args))
        while "termgym gateway on " not in (printed := capsys.readouterr().out):
            await asyncio.sleep(0.05)
        base = printed.split("termgym gateway on ")[1].split(":")[0:3]
        url = ":".join(base).rstrip(",").split(" ")[0]

        def send(session_id: str, content: str, by_header: bool) -> int:
            body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}]}).encode()
            headers = {"content-type": "application/json"}
            if by_header:  # the header carries latin-1 only: the others go in the path, percent-encoded
                target, headers[SESSION_HEADER] = f"{url}/v1/chat/completions", session_id
            else:
                target = f"{url}/sessions/{urllib.parse.quote(session_id, safe='')}/v1/chat/completions"
            with urllib.request.urlopen(urllib.request.Request(target, body, headers), timeout=10) as answer:
                return answer.status

        for session_id in COLLIDING_IDS:
            by_header = session_id.isascii() and "x" not in session_id
            for turn in range(2 if session_id.startswith("run") else 1):
                assert await asyncio.to_thread(send, session_id, f"{session_id} #{turn}", by_header) == 200
        os.kill(os.getpid(), signal.SIGTERM)
        assert await asyncio.wait_for(serving, 10) == 0
    files = sorted(out_dir.iterdir())
    assert all(path.parent == out_dir and path.is_file() for path in files)
    assert [path for path in tmp_path.rglob("*") if path.is_file() and out_dir not in path.parents] == []
    written = {}
    for path in files:
        record = json.loads(path.read_text(encoding="utf-8"))
        written[record["session"]] = [call["request"]["messages"][0]["content"] for call in record["calls"]]
        assert path.name == session_file_name(record["session"])  # where a reader looks for it
    assert written == {
        session_id: [f"{session_id} #{turn}" for turn in range(2 if session_id.startswith("run") else 1)]
        for session_id in COLLIDING_IDS
    }
    assert (out_dir / "run_0001.json").is_file() and (out_dir / "run%2F0001.json").is_file()


def test_termgym_gateway_refuses_a_bad_upstream_in_one_line(capsys):
    assert main(["gateway", "--upstream", "ftp://nowhere"]) == 2
    assert "base URL must be http(s)" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("end", "result", "statuses", "reason"),
    [
        ("deadline", HarnessResult("NotFoundError", error="404"), [404], "agent_timeout"),
        (
            None,
            HarnessResult("ContextWindowExceededError", error="too long", context_error=True),
            [400],
            "context_exhausted",
        ),
        (None, HarnessResult("LimitsExceeded"), [200], "max_turns"),
        (None, HarnessResult("TimeExceeded"), [200], "agent_timeout"),
        (None, HarnessResult("RepeatedFormatError"), [200, 200, 200], "parse_errors"),
        (None, HarnessResult("KeyError", error="'x'"), [200], "harness_exit"),
        (None, HarnessResult("Exited"), [], "harness_exit"),
        (None, None, [], "harness_exit"),
    ],
)
def test_how_a_harness_that_stopped_ends_the_episode(end, result, statuses, reason):
    from termgym.gateway import Call, GatewaySession
    from termgym.integrations.harness import _stop_reason

    session = GatewaySession("s", SessionUpstream(FakeSession([]), Transcript(), "m"))
    session.end_reason = end
    session.calls = [Call(i, "/chat/completions", {}, status) for i, status in enumerate(statuses)]
    assert _stop_reason(session, result) == reason


def test_a_harness_that_gave_up_after_a_failed_model_call_is_a_model_error():
    from termgym.gateway import Call, GatewaySession
    from termgym.integrations.harness import _stop_reason

    session = GatewaySession("s", SessionUpstream(FakeSession([]), Transcript(), "m"))
    session.calls = [
        Call(0, "/chat/completions", {}, 200),
        Call(1, "/chat/completions", {}, 503, error="upstream HTTP 503"),
    ]
    with pytest.raises(ModelError, match="upstream HTTP 503"):
        _stop_reason(session, HarnessResult("InternalServerError", error="503"))
