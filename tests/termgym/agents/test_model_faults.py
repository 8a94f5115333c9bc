"""The model agent against a faulty OpenAI-compatible server (``fault_server.FaultServer``): each
fault of the model's server, each kind of reply that does not parse, the context window, and the
command line around them (``termgym run`` / ``check`` / ``replay``), on the embedded backend.

Every test is bounded (``asyncio.wait_for``; the project has no pytest-timeout) and fast: small
request timeouts, few retries, Retry-After in fractions of a second. Every test checks that no
sandbox outlives it (``no_leaks``)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from termgym.agents import ModelConfig
from termgym.agents.model import ModelAgent
from termgym.agents.prompts import ELIDED, SUMMARY_REQUEST
from termgym.agents.settings import build_model_agent
from termgym.cli import main
from termgym.episode.options import EnvOptions
from termgym.records import TrialRecord, read_records
from termgym.tasks.bundled import resolve_task
from termgym.transcript import read_transcript
from termgym.trial import run_trial
from tests.termgym.agents.fault_server import (
    FOREVER,
    MODEL,
    FaultServer,
    RecordedRequest,
    Reply,
    bash,
    call,
    context_length,
    die,
    empty,
    hang,
    rate_limit,
    render_chat,
    server_error,
    storm,
    text,
    tool_call,
    tool_calls,
)

pytestmark = pytest.mark.usefixtures("no_leaks")

TASK = "file-ops/organize-by-extension"
TASKS = (
    "file-ops/organize-by-extension",
    "file-ops/bulk-rename",
    "file-ops/prune-cache",
    "text-processing/csv-revenue-by-region",
)
BOUND = 30.0  # seconds: no trial of these tests may take longer
SUBMIT = tool_call("submit", {})
UNSET_KEY_VAR = "TERMGYM_TEST_SURELY_UNSET_API_KEY"


# -- helpers -----------------------------------------------------------------------------------------


@pytest.fixture
async def server() -> AsyncIterator[FaultServer]:
    async with FaultServer() as running:
        yield running


def model_agent(server: FaultServer, **settings: Any) -> ModelAgent:
    """The model agent on ``server``: short request timeouts and few retries unless ``settings`` say."""
    config = {"model": MODEL, "base_url": server.base_url, "request_timeout": 2.0, "max_retries": 2, **settings}
    return build_model_agent(ModelConfig(**config), environ={})


async def trial(
    agent: ModelAgent, tmp_path: Path, *, task: str = TASK, bound: float = BOUND, **options: Any
) -> TrialRecord:
    """One trial of ``task``, its transcript kept under ``tmp_path/trials``; never longer than ``bound``."""
    env_options = EnvOptions(trials_dir=str(tmp_path / "trials"), **options)
    try:
        return await asyncio.wait_for(run_trial(resolve_task(task), agent, env_options), bound)
    finally:
        await agent.aclose()


def chats(server: FaultServer) -> list[RecordedRequest]:
    return server.requests_to("chat/completions")


def transcript(record: TrialRecord) -> dict[str, Any]:
    assert record.transcript is not None and Path(record.transcript).is_file()
    return read_transcript(record.transcript)


def assert_verified(record: TrialRecord) -> None:
    """The verifier ran and reported its assertions."""
    assert record.total > 0 and record.report_format is not None and record.assertions


def assert_unverified(record: TrialRecord) -> None:
    assert record.total == 0 and record.reward == 0.0 and not record.assertions and not record.resolved


def agent_seconds(record: TrialRecord) -> float:
    """The trial's time outside sandbox setup and verification."""
    return record.timings["total"] - record.timings.get("setup", 0.0) - record.timings.get("verify", 0.0)


async def cli(*argv: str, bound: float = 60.0) -> int:
    """``termgym ARGV`` (``main`` runs its own event loop) in a daemon thread, so that a command
    that never ends fails this test after ``bound`` seconds instead of hanging the session."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[int] = loop.create_future()

    def settle(outcome: Any, failed: bool) -> None:
        if not done.done():
            done.set_exception(outcome) if failed else done.set_result(outcome)

    def target() -> None:
        try:
            outcome, failed = main(list(argv)), False
        except BaseException as exc:  # handed to the awaiting test
            outcome, failed = exc, True
        try:
            loop.call_soon_threadsafe(settle, outcome, failed)
        except RuntimeError:  # the test's loop is closed: it gave up already
            pass

    threading.Thread(target=target, name="termgym-cli", daemon=True).start()
    return await asyncio.wait_for(done, bound)


def model_flags(server: FaultServer, *extra: str) -> list[str]:
    return ["--agent", "model", "--model", MODEL, "--base-url", server.base_url, *extra]


@pytest.fixture
def sandbox_starts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every sandbox the environment would create, and every backend preflight, and
    refuses both: for the commands that must fail before any sandbox starts."""
    started: list[str] = []

    def refuse(backend: str, *args: Any, **kwargs: Any) -> Any:
        started.append(backend)
        raise AssertionError(f"a sandbox ({backend}) was started")

    monkeypatch.setattr("termgym.episode.spec.create_sandbox", refuse)
    monkeypatch.setattr("termgym.cli.runs.preflight", refuse)
    monkeypatch.setattr("termgym.cli.episodes.preflight", refuse)
    return started


def assert_in_order(text: str, pieces: list[str]) -> None:
    at = 0
    for piece in pieces:
        found = text.find(piece, at)
        assert found >= 0, f"{piece!r} missing after offset {at} in:\n{text}"
        at = found + len(piece)


def one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr
    return lines[0]


# -- 1-3: rate limits and server errors -----------------------------------------------------------


async def test_429_storm_shorter_than_the_retries_waits_retry_after_and_completes(server, tmp_path):
    retry_after = 0.2
    server.add(tool_call("bash", {"command": "ls /app"}), storm(2, retry_after), SUBMIT)
    record = await trial(model_agent(server, max_retries=3), tmp_path)

    assert record.error is None and record.stop_reason == "submitted"
    assert_verified(record)
    requests = chats(server)
    assert [r.status for r in requests] == [200, 429, 429, 200]
    gaps = [later.time - earlier.time for earlier, later in pairwise(requests[1:])]
    assert all(gap >= retry_after for gap in gaps), gaps  # the SDK honoured Retry-After
    assert record.usage["requests"] == 2  # the replies, not the attempts
    assert record.turns == 1 and transcript(record)["stop_reason"] == "submitted"


@pytest.mark.parametrize(
    "fault",
    [storm(10, 0.01), server_error(503, count=10, retry_after=0.01)],
    ids=["429", "503"],
)
async def test_a_storm_longer_than_the_retries_is_a_model_error(server, tmp_path, fault):
    server.add(tool_call("bash", {"command": "echo before-the-storm"}), fault)
    record = await trial(model_agent(server, max_retries=2), tmp_path)

    assert record.error is not None and record.error["kind"] == "model_error"
    assert str(fault.status) in record.error["message"]
    assert record.stop_reason == "model_error"
    assert_unverified(record)  # the model could not be reached: no verdict on the agent
    assert len(chats(server)) == 1 + 3  # the good turn, then max_retries + 1 attempts
    assert record.turns == 1 and record.usage["requests"] == 1
    saved = transcript(record)  # written although the trial failed
    assert saved["stop_reason"] == "model_error"
    assert [t["action"]["kind"] for t in saved["turns"]] == ["command"]
    assert saved["turns"][0]["action"]["command"] == "echo before-the-storm"


async def test_500_502_503_then_success_completes(server, tmp_path):
    server.add(
        server_error(500, retry_after=0.01),
        server_error(502, retry_after=0.01),
        server_error(503, retry_after=0.01),
        SUBMIT,
    )
    record = await trial(model_agent(server, max_retries=3), tmp_path)

    assert record.error is None and record.stop_reason == "submitted"
    assert_verified(record)
    assert [r.status for r in chats(server)] == [500, 502, 503, 200]
    assert record.usage["requests"] == 1


# -- 4: hangs ------------------------------------------------------------------------------------------


async def test_a_hang_past_the_request_timeout_is_retried(server, tmp_path):
    server.add(hang(FOREVER), SUBMIT)
    record = await trial(model_agent(server, request_timeout=0.3, max_retries=2), tmp_path)

    assert record.error is None and record.stop_reason == "submitted"
    assert_verified(record)
    first, second = chats(server)
    assert first.outcome == "hang" and first.status == 0  # given up on, never answered
    assert second.status == 200 and second.time - first.time >= 0.3


async def test_every_attempt_hanging_is_a_model_error(server, tmp_path):
    server.add(hang(FOREVER), hang(FOREVER))
    record = await trial(model_agent(server, request_timeout=0.3, max_retries=1), tmp_path)

    assert record.error is not None and record.error["kind"] == "model_error"
    assert "request timeout" in record.error["message"]
    assert record.stop_reason == "model_error"
    assert_unverified(record)
    assert [r.outcome for r in chats(server)] == ["hang", "hang"]
    assert transcript(record)["stop_reason"] == "model_error"


async def test_a_hang_past_the_agent_timeout_ends_the_episode_at_the_agent_timeout(server, tmp_path):
    agent_timeout = 1.0
    server.add(hang(FOREVER))
    started = time.monotonic()
    record = await trial(
        model_agent(server, request_timeout=30.0, max_retries=0), tmp_path, agent_timeout=agent_timeout
    )
    wall = time.monotonic() - started

    assert record.stop_reason == "agent_timeout"
    assert record.error is not None and record.error["kind"] == "agent_timeout"
    assert_verified(record)  # a truncation: the work so far is verified
    assert agent_timeout - 0.1 <= agent_seconds(record) < agent_timeout + 0.75
    assert wall < agent_timeout + 5  # not the request timeout's 30 s
    assert len(chats(server)) == 1 and chats(server)[0].status == 0


async def test_a_hanging_models_endpoint_does_not_outlive_the_agent_timeout(server, tmp_path):
    """``GET /models`` (the context window) is a request of the episode too: it must not hold the
    episode past its agent time (model.py: "no request outlives the episode's agent time")."""
    agent_timeout = 1.0
    server.script.models_queue.append(hang(FOREVER))
    server.add(SUBMIT)
    record = await trial(model_agent(server, request_timeout=2.5, max_retries=0), tmp_path, agent_timeout=agent_timeout)

    assert record.stop_reason == "agent_timeout"
    assert agent_seconds(record) < agent_timeout + 0.75, record.timings


# -- 5: replies that do not parse ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reply", "answered", "says"),
    [
        (tool_call("bash", '{"command": ', id="broken"), ["broken"], "not valid JSON"),
        (
            tool_calls(call("bash", {"command": "ls"}, id="one"), call("submit", {}, id="two")),
            ["one", "two"],
            "called 2 tools",
        ),
        (text("I would list the files first."), [], "called no tool"),
        (empty(), [], "called no tool"),
    ],
    ids=["malformed-json", "two-tool-calls", "text-only", "empty"],
)
async def test_a_reply_that_does_not_parse_is_counted_and_shown_to_the_model(server, tmp_path, reply, answered, says):
    server.add(reply, SUBMIT)
    record = await trial(model_agent(server), tmp_path)

    assert record.error is None and record.stop_reason == "submitted"
    assert record.parse_errors == 1 and record.turns == 0  # nothing ran
    _, retry = chats(server)
    messages = retry.body["messages"]
    if answered:  # one tool message answering each tool call of the reply, in order
        shown = messages[-len(answered) :]
        assert [m["role"] for m in shown] == ["tool"] * len(answered)
        assert [m["tool_call_id"] for m in shown] == answered
        assistant = messages[-len(answered) - 1]
        assert [c["id"] for c in assistant["tool_calls"]] == answered
    else:  # no tool call to answer: a user message
        shown = messages[-1:]
        assert shown[0]["role"] == "user" and messages[-2]["role"] == "assistant"
    assert all(says in m["content"] and m["content"].startswith("Your reply was not an action") for m in shown)
    first = transcript(record)["turns"][0]
    assert first["action"]["kind"] == "invalid" and says in first["action"]["error"]
    assert first["result"] is None and first["observation"] == shown[0]["content"]


async def test_max_parse_errors_in_a_row_end_the_episode(server, tmp_path):
    server.add(text("hmm"), empty(), tool_call("bash", "{not json"), SUBMIT)
    record = await trial(model_agent(server, max_parse_errors=3), tmp_path)

    assert record.stop_reason == "parse_errors" and record.error is None
    assert_verified(record)  # a truncation, then verification
    assert record.parse_errors == 3 and record.turns == 0
    assert len(chats(server)) == 3  # the submit was never asked for
    saved = transcript(record)
    assert saved["stop_reason"] == "parse_errors"
    assert [t["action"]["kind"] for t in saved["turns"]] == ["invalid"] * 3


async def test_a_reply_that_parses_resets_the_parse_error_count(server, tmp_path):
    bad = text("no tool")
    server.add(bad, bad, tool_call("bash", {"command": "true"}), bad, bad, SUBMIT)
    record = await trial(model_agent(server, max_parse_errors=3), tmp_path)

    assert record.stop_reason == "submitted" and record.parse_errors == 4 and record.turns == 1


async def test_unparsable_replies_count_against_max_turns(server, tmp_path):
    bad = text("no tool")
    server.add(bad, tool_call("bash", {"command": "true"}), bad, SUBMIT)
    record = await trial(model_agent(server), tmp_path, max_turns=3)

    assert record.stop_reason == "max_turns" and record.error is None
    assert_verified(record)
    assert record.turns == 1 and record.parse_errors == 2 and len(chats(server)) == 3


# -- 6: the text action format ------------------------------------------------------------------------


async def test_the_text_format_runs_a_fenced_bash_block_and_submits(server, tmp_path):
    server.add(bash("echo text-format-$((6 * 7))"), text("No block here."), bash(":submit", prose="Done."))
    record = await trial(model_agent(server, action_format="text"), tmp_path)

    assert record.error is None and record.stop_reason == "submitted"
    assert_verified(record)
    assert record.turns == 1 and record.parse_errors == 1
    first, second, third = chats(server)
    assert "tools" not in first.body  # the text format sends no tools
    observation = second.body["messages"][-1]
    assert observation["role"] == "user" and "text-format-42" in observation["content"]
    assert "Exit code: 0" in observation["content"]
    rejection = third.body["messages"][-1]
    assert rejection["role"] == "user" and "no fenced shell block" in rejection["content"]
    kinds = [t["action"]["kind"] for t in transcript(record)["turns"]]
    assert kinds == ["command", "invalid", "submit"]


# -- 7: the context window ----------------------------------------------------------------------------


async def test_a_full_context_with_policy_none_is_context_exhausted(server, tmp_path):
    server.add(tool_call("bash", {"command": "echo one"}), context_length(requested=100_000), SUBMIT)
    record = await trial(model_agent(server, context="none"), tmp_path)

    assert record.stop_reason == "context_exhausted" and record.error is None
    assert_verified(record)
    assert record.turns == 1 and len(chats(server)) == 2
    assert chats(server)[-1].outcome == "context_length"


async def test_a_full_context_with_policy_truncate_elides_old_observations_and_goes_on(server, tmp_path):
    words = ["one", "two", "three", "four"]
    server.add(*(tool_call("bash", {"command": f"echo {w}"}) for w in words), context_length(requested=100_000), SUBMIT)
    record = await trial(model_agent(server, context="truncate"), tmp_path)

    assert record.stop_reason == "submitted" and record.error is None
    assert record.turns == 4
    rejected, retried = chats(server)[-2:]
    assert rejected.outcome == "context_length" and retried.status == 200

    def observations(request: RecordedRequest) -> list[str]:
        return [m["content"] for m in request.body["messages"] if m["role"] == "tool"]

    assert all(ELIDED not in o for o in observations(rejected))
    elided = observations(retried)
    assert elided[:2] == [ELIDED, ELIDED]  # the oldest two, their bodies only
    assert "three" in elided[2] and "four" in elided[3]  # the two latest kept whole
    assert len(retried.body["messages"]) == len(rejected.body["messages"])  # the structure stays
    saved = transcript(record)
    assert [s["reason"] for s in saved["segments"]] == ["start", "truncate"]
    assert all(ELIDED not in str(m.get("content")) for m in saved["segments"][0]["messages"])


async def test_a_full_context_with_policy_summarize_continues_from_the_summary(server, tmp_path):
    summary = "SUMMARY: I listed /app three times; nothing is sorted yet."
    commands = [tool_call("bash", {"command": f"echo turn-{i}"}) for i in range(3)]
    server.add(*commands, context_length(requested=100_000), text(summary), SUBMIT)
    record = await trial(model_agent(server, context="summarize"), tmp_path)

    assert record.stop_reason == "submitted" and record.error is None
    *_, rejected, asked, resumed = chats(server)
    assert rejected.outcome == "context_length"
    assert asked.body["messages"][:-1] == rejected.body["messages"]  # the history, then the request
    assert asked.body["messages"][-1]["role"] == "user" and "summary" in asked.body["messages"][-1]["content"]
    assert [m["role"] for m in resumed.body["messages"]] == ["system", "user"]  # a new segment
    assert summary in resumed.body["messages"][1]["content"]
    saved = transcript(record)
    assert saved["summaries"] == 1 and saved["summaries_failed"] == 0
    assert [s["reason"] for s in saved["segments"]] == ["start", "summary"]
    assert record.usage["requests"] == 5  # three commands, the summary, the submit


async def test_summarize_gives_up_when_even_the_summary_leaves_no_room(server, tmp_path):
    """The summary is accepted but the segment it starts still does not fit (its first request is
    refused too): there is nothing new to summarize, so the policy cannot make room and the episode
    ends ``context_exhausted``, instead of asking for summary after summary until the agent time
    runs out."""

    def answer(body: dict[str, Any]) -> Any:
        last = body["messages"][-1]
        return (
            text("SUMMARY: nothing done yet.")
            if last["content"] == SUMMARY_REQUEST
            else context_length(requested=100_000)
        )

    server.script.default = answer
    record = await trial(model_agent(server, context="summarize"), tmp_path, agent_timeout=2.0)

    summaries = [r for r in chats(server) if r.body["messages"][-1]["content"] == SUMMARY_REQUEST]
    assert len(summaries) <= 2, f"{len(summaries)} summaries asked for in {len(chats(server))} requests"
    assert record.stop_reason == "context_exhausted"


async def test_max_tokens_is_clamped_to_what_the_window_has_left(tmp_path):
    """The window comes from ``/v1/models`` (max_model_len); the server enforces it. The first
    reply's usage (its completion counts hidden reasoning tokens the next prompt does not carry)
    makes the estimate of the next prompt exceed its real length, so the clamped budget fits."""
    window, budget, reasoning = 8000, 4096, 3000
    async with FaultServer(max_model_len=window) as server:
        server.script.enforce_context_length = True
        first_call = call("bash", {"command": "echo hi"})
        server.add(Reply(tool_calls=(first_call,), token_ids=tuple([120] * reasoning)), SUBMIT)
        record = await trial(model_agent(server, max_tokens=budget), tmp_path)

    assert record.error is None and record.stop_reason == "submitted"
    first, second = chats(server)
    assert all(r.status == 200 for r in server.requests)  # nothing went over the window
    prompt = len(render_chat(first.body["messages"]))  # the fake tokenizer: one token per character
    assert prompt + budget <= window < prompt + reasoning + budget  # the premise: the clamp must act
    assert first.body["max_tokens"] == budget  # nothing to clamp to before the first reply
    assert 64 <= second.body["max_tokens"] <= window - (prompt + reasoning)
    assert record.usage["completion_tokens"] >= reasoning


async def test_the_first_request_fits_a_window_smaller_than_max_tokens(tmp_path):
    """A server with a 2048-token window and the default 4096-token budget. The agent knows the
    window (``/v1/models``) before its first request but has no estimate of the prompt yet, and
    vLLM answers 400 to prompt + max_tokens > max_model_len: the episode must still get a reply
    whose budget fits (not end ``context_exhausted`` before its first turn)."""
    window = 2048
    async with FaultServer(max_model_len=window) as server:
        server.script.enforce_context_length = True
        server.add(SUBMIT)
        record = await trial(model_agent(server), tmp_path)

    assert record.stop_reason == "submitted", (
        f"{record.stop_reason}: max_tokens {[r.body['max_tokens'] for r in chats(server)]}"
    )
    answered = [r for r in chats(server) if r.status == 200]
    assert answered and all(len(render_chat(r.body["messages"])) + r.body["max_tokens"] <= window for r in answered)


# -- 8: the server dies during a run ------------------------------------------------------------------


async def test_a_server_dying_mid_run_leaves_a_record_for_every_trial(server, tmp_path):
    server.add(SUBMIT, SUBMIT, die())  # two trials submit; the third request kills the server
    out = tmp_path / "run"
    code = await cli(
        "run",
        *TASKS,
        "-n",
        "2",
        "--out",
        str(out),
        *model_flags(server, "--max-retries", "1", "--request-timeout", "5"),
    )

    assert code == 1  # trials are missing: an infrastructure failure (cli/__init__: exit codes)
    assert server.dead
    records = read_records(out / "trials.jsonl")
    # the scheduler replaced each lost trial twice (its retries), and each replacement was lost too
    assert sorted({r["task"] for r in records}) == sorted(f"termgym/{t}" for t in TASKS)
    kinds = sorted((r["error"] or {}).get("kind", "-") for r in records)
    assert kinds == ["-", "-"] + ["model_error"] * 6
    for record in records:
        failed = record["error"] is not None
        assert record["stop_reason"] == ("model_error" if failed else "submitted")
        assert (record["total"] > 0) != failed  # verified unless the model was lost
        assert Path(record["transcript"]).is_file()
        assert read_transcript(record["transcript"])["stop_reason"] == record["stop_reason"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"] == 8 and summary["scored"] == 2 and summary["excluded"] == {"model_error": 6}


# -- 9: a hosted API without the vLLM extras ---------------------------------------------------------


async def test_a_server_rejecting_return_token_ids_is_asked_again_without_it(server, tmp_path):
    server.script.reject_fields = {"return_token_ids"}
    server.add(tool_call("bash", {"command": "echo hosted"}), SUBMIT)
    record = await trial(model_agent(server), tmp_path)

    assert record.error is None and record.stop_reason == "submitted"
    assert_verified(record)
    rejected, *later = chats(server)
    assert rejected.status == 400 and rejected.outcome == "reject" and rejected.body["return_token_ids"] is True
    assert len(later) == 2 and all(r.status == 200 and "return_token_ids" not in r.body for r in later)
    assert all(r.body.get("logprobs") is True for r in later)  # the other optional field stays
    saved = transcript(record)
    assert saved["notes"] == ["the server rejects return_token_ids: asked without it"]
    assert all(t["reply"]["tokens"] is None for t in saved["turns"])  # no ids came back
    assert record.usage["requests"] == 2


# -- 10: bad settings fail before any sandbox ---------------------------------------------------------


@pytest.mark.parametrize("command", ["run", "check"])
def test_a_missing_api_key_is_one_line_and_exit_2(command, tmp_path, monkeypatch, capsys, sandbox_starts):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(UNSET_KEY_VAR, raising=False)
    argv = [command, TASK, "--agent", "model", "--model", MODEL, "--base-url", "http://127.0.0.1:9/v1"]
    argv += ["--api-key-env", UNSET_KEY_VAR] + (["--out", str(tmp_path / "run")] if command == "run" else [])
    code = main(argv)

    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("termgym: error:") and UNSET_KEY_VAR in line
    assert sandbox_starts == [] and list(tmp_path.iterdir()) == []  # no run directory, no records


@pytest.mark.parametrize("url", ["ftp://x", "not a url", "http://127.0.0.1:99999/v1", "http://[::1/v1"])
@pytest.mark.parametrize("command", ["run", "check"])
def test_a_bad_base_url_is_one_line_and_exit_2(command, url, tmp_path, monkeypatch, capsys, sandbox_starts):
    monkeypatch.chdir(tmp_path)
    argv = [command, TASK, "--agent", "model", "--model", MODEL, "--base-url", url]
    code = main(argv + (["--out", str(tmp_path / "run")] if command == "run" else []))

    line = one_error_line(capsys.readouterr().err)
    assert code == 2 and line.startswith("termgym: error:")
    assert sandbox_starts == [] and list(tmp_path.iterdir()) == []


# -- 11: --resume ---------------------------------------------------------------------------------------


async def test_resume_reruns_only_the_trials_lost_to_model_errors(server, tmp_path):
    tasks = TASKS[:3]
    server.add(SUBMIT)
    server.script.default = rate_limit(0.01)  # every later request: a 429
    out = tmp_path / "run"
    flags = ["-n", "1", "--out", str(out), *model_flags(server, "--max-retries", "0")]
    assert await cli("run", *tasks, *flags) == 1  # trials lost to the model: exit 1
    first = read_records(out / "trials.jsonl")
    lost = sorted({r["task"] for r in first if r["error"] and r["error"]["kind"] == "model_error"})
    assert len(first) == 1 + 2 * 3 and len(lost) == 2  # each lost trial was tried again twice

    server.script.default = SUBMIT  # healthy again
    asked = len(chats(server))
    assert await cli("run", *tasks, "--resume", *flags) == 0

    records = read_records(out / "trials.jsonl")
    rerun = records[len(first) :]
    assert len(rerun) == 2 and sorted(r["task"] for r in rerun) == lost
    assert all(r["error"] is None and r["stop_reason"] == "submitted" for r in rerun)
    assert len(chats(server)) - asked == 2  # one request per rerun trial, none for the kept one
    summary = json.loads((out / "summary.json").read_text())
    assert summary["records"] == 3 and summary["scored"] == 3 and summary["excluded"] == {}
    assert summary["stop_reasons"] == {"submitted": 3} and summary["trials"] == 3


# -- 12: replay and check -------------------------------------------------------------------------------


async def test_replay_prints_the_commands_and_their_exit_codes(server, tmp_path, capsys):
    server.add(
        tool_call("bash", {"command": "echo replay-marker"}),
        tool_call("bash", {"command": "ls /no-such-dir"}),
        SUBMIT,
    )
    record = await trial(model_agent(server), tmp_path)
    capsys.readouterr()
    assert await cli("replay", str(Path(record.transcript or "").parent)) == 0

    shown = capsys.readouterr().out
    header, _, turns = shown.partition("── turn 0")
    assert "stop submitted" in header and MODEL in header and "3 turns" in header
    assert_in_order(turns, ["$ echo replay-marker", "exit 0", "replay-marker", "$ ls /no-such-dir", "exit 2", "submit"])


async def test_check_prints_the_transcript_above_the_assertions(server, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    server.add(tool_call("bash", {"command": "echo check-marker"}), SUBMIT)
    code = await cli("check", TASK, *model_flags(server, "--max-retries", "0"))

    shown = capsys.readouterr().out
    assert code == 0
    command, table = shown.find("$ echo check-marker"), shown.find("assertion")
    assert -1 < command < table, shown
    assert "stop submitted" in shown[table:]
    assert len(list(tmp_path.glob("runs/check-*/trials/*/trajectory.json"))) == 1


async def test_check_exits_1_when_the_model_cannot_be_reached(server, tmp_path, monkeypatch, capsys):
    """cli/__init__: exit 1 for an infrastructure failure; trial.py counts "the model could not be
    reached" among them (and summary.INFRASTRUCTURE lists model_error)."""
    monkeypatch.chdir(tmp_path)
    server.add(server_error(503, count=5, retry_after=0.01))
    code = await cli("check", TASK, *model_flags(server, "--max-retries", "0"))

    shown = capsys.readouterr().out
    assert "model_error" in shown
    assert code == 1


# -- 13: settings from termgym.toml ------------------------------------------------------------------


async def test_settings_come_from_termgym_toml_and_flags_win(server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "termgym.toml").write_text(
        f'[model]\nmodel = "{MODEL}"\nbase-url = "{server.base_url}"\nmax_retries = 0\n\n[run]\nattempts = 2\n'
    )
    server.script.default = SUBMIT
    assert await cli("run", TASK, "--out", "from-file") == 0  # --model from the file implies --agent model
    records = read_records(tmp_path / "from-file" / "trials.jsonl")
    assert len(records) == 2 and {r["model"] for r in records} == {MODEL} and records[0]["agent"] == "model"
    assert await cli("run", TASK, "-k", "1", "--out", "flag-wins") == 0
    assert len(read_records(tmp_path / "flag-wins" / "trials.jsonl")) == 1


@pytest.mark.parametrize(
    ("table", "says"),
    [
        ("[run]\nno-such-setting = 1\n", "[run] no-such-setting"),
        ('[model]\naction-format = "xml"\n', "action-format must be one of tool, text"),
        ("[run\n", "invalid TOML"),
    ],
)
def test_a_bad_termgym_toml_is_one_line_and_exit_2(table, says, tmp_path, monkeypatch, capsys, sandbox_starts):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "termgym.toml").write_text(table)
    assert main(["run", TASK]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("termgym: error:") and says in line and sandbox_starts == []


def test_model_settings_for_another_agent_are_a_usage_error(capsys, sandbox_starts):
    assert main(["check", TASK, "--agent", "oracle", "--model", MODEL]) == 2
    assert "apply to --agent model only" in one_error_line(capsys.readouterr().err) and sandbox_starts == []
