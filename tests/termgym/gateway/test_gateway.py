"""The recording gateway (``termgym.gateway``) against a faulty OpenAI-compatible server
(``fault_server.FaultServer``), driven as a harness drives it: real HTTP requests to the gateway
(aiohttp, and the ``openai`` SDK), the upstream reached through ``ForwardUpstream``. Then the pure
parts: the wire shapes (``shapes``) and the token samples built from calls (``merge_calls``).

Every test is bounded (``bounded``: the project has no pytest-timeout) and fast."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from termgym.agents.actions import ToolCall
from termgym.agents.client import Completion
from termgym.gateway import SESSION_HEADER, Call, ForwardUpstream, Gateway, merge_calls
from termgym.gateway.calls import CHAT_PATH
from termgym.gateway.shapes import chat_response, extends, same_message
from tests.termgym.agents.fault_server import (
    FOREVER,
    MODEL,
    FaultServer,
    die,
    encode,
    hang,
    render_chat,
    server_error,
    storm,
    text,
    token_logprob,
)

MESSAGES = [{"role": "user", "content": "hi"}]


def bounded(seconds: float = 15.0):
    """The test fails after ``seconds`` instead of hanging the session."""

    def wrap(test):
        @functools.wraps(test)
        async def run(*args: Any, **kwargs: Any) -> None:
            await asyncio.wait_for(test(*args, **kwargs), seconds)

        return run

    return wrap


@pytest.fixture
async def server() -> AsyncIterator[FaultServer]:
    async with FaultServer() as running:
        yield running


@pytest.fixture
async def upstream_http() -> AsyncIterator[aiohttp.ClientSession]:
    """The gateway's own client session, shared by its ``ForwardUpstream``\\ s."""
    async with aiohttp.ClientSession() as http:
        yield http


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    """The harness's client session."""
    async with aiohttp.ClientSession() as http:
        yield http


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    running = await Gateway().start()
    try:
        yield running
    finally:
        await running.aclose()


def forward(server: FaultServer, http: aiohttp.ClientSession, **options: Any) -> ForwardUpstream:
    return ForwardUpstream(server.base_url, http, **options)


def chat(messages: list[dict[str, Any]] = MESSAGES, **extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": messages, **extra}


async def post(
    client: aiohttp.ClientSession, base: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any], Any]:
    """POST ``body`` (bytes as they are, else JSON) to ``base/chat/completions``: status, JSON, headers."""
    data, payload = (body, None) if isinstance(body, bytes) else (None, body)
    async with client.post(base + "/chat/completions", headers=headers, data=data, json=payload) as response:
        return response.status, await response.json(content_type=None), response.headers


def chats(server: FaultServer) -> list[dict[str, Any]]:
    return [r.body for r in server.requests_to("chat/completions")]


# -- pass-through --------------------------------------------------------------------------------


@bounded()
async def test_rate_limit_storm_passes_through_unretried(server, gateway, upstream_http, client):
    server.add(storm(3, retry_after="7"))
    session = gateway.open("s", forward(server, upstream_http), model=MODEL)
    for _ in range(2):
        status, body, headers = await post(client, gateway.base_url("s"), chat())
        assert (status, headers.get("Retry-After")) == (429, "7")
        assert body["error"]["code"] == "rate_limit_exceeded"
    sdk = openai.AsyncOpenAI(base_url=gateway.base_url("s"), api_key="x", max_retries=0)
    try:
        with pytest.raises(openai.RateLimitError) as caught:
            await sdk.chat.completions.create(model=MODEL, messages=MESSAGES)  # pyright: ignore[reportArgumentType]
        assert caught.value.response.headers["retry-after"] == "7"
        reply = await sdk.chat.completions.create(model=MODEL, messages=MESSAGES)  # pyright: ignore[reportArgumentType]  # the storm is over
    finally:
        await sdk.close()
    assert reply.choices[0].message.content == "ok"
    assert len(chats(server)) == 4  # the gateway never retried: one upstream request per call
    assert [c.status for c in session.calls] == [429, 429, 429, 200]
    assert all(c.error and "429" in c.error for c in session.calls[:3]) and session.calls[3].error is None
    assert session.calls[3].prompt_ids == encode(render_chat(MESSAGES))


@bounded()
async def test_server_errors_pass_through_and_are_recorded(server, gateway, upstream_http, client):
    server.add(server_error(500), server_error(503, retry_after=2))
    session = gateway.open("s", forward(server, upstream_http))
    first = await post(client, gateway.base_url("s"), chat())
    second = await post(client, gateway.base_url("s"), chat())
    assert first[0] == 500 and first[1]["error"]["type"] == "server_error"
    assert second[0] == 503 and second[2].get("Retry-After") == "2"
    assert len(chats(server)) == 2
    assert [c.status for c in session.calls] == [500, 503]
    assert "HTTP 500" in session.calls[0].error and "overloaded" in session.calls[1].error
    assert session.merged().segments == []  # failed calls make no sample


# -- deadline, dead upstream -----------------------------------------------------------------------


@bounded()
async def test_upstream_hang_ends_at_the_session_deadline(server, gateway, upstream_http, client):
    server.add(hang(FOREVER))
    session = gateway.open("s", forward(server, upstream_http), deadline=time.monotonic() + 1.5)
    start = time.monotonic()
    status, body, _ = await post(client, gateway.base_url("s"), chat())
    assert status == 404 and body["error"]["type"] == "session_ended"
    assert 1.0 < time.monotonic() - start < 2.5
    assert session.end_reason == "deadline"
    start = time.monotonic()
    status, body, _ = await post(client, gateway.base_url("s"), chat())
    assert status == 404 and body["error"]["type"] == "session_ended"
    assert time.monotonic() - start < 0.5
    assert len(chats(server)) == 1  # the later call never reached the upstream
    assert [c.status for c in session.calls] == [404, 404]


@bounded()
async def test_dying_upstream_is_a_502(server, gateway, upstream_http, client):
    server.add(text("alive"), die())
    session = gateway.open("s", forward(server, upstream_http))
    assert (await post(client, gateway.base_url("s"), chat()))[0] == 200  # a pooled connection
    for _ in range(2):  # cut mid-request, then refused
        start = time.monotonic()
        status, body, _ = await post(client, gateway.base_url("s"), chat())
        assert status == 502 and body["error"]["type"] == "upstream_unreachable"
        assert time.monotonic() - start < 2.0
    await server.stop()
    assert (await post(client, gateway.base_url("s"), chat()))[0] == 502
    assert [c.status for c in session.calls] == [200, 502, 502, 502]
    assert all("cannot reach" in c.error for c in session.calls[1:])


# -- sessions ---------------------------------------------------------------------------------------


@bounded()
async def test_concurrent_sessions_keep_their_own_calls(server, gateway, upstream_http, client):
    async def echo(body: dict[str, Any]):
        await asyncio.sleep(0.05)  # the calls overlap
        return text("re " + body["messages"][0]["content"])

    server.script.default = echo
    upstream = forward(server, upstream_http)
    sessions = {sid: gateway.open(sid, upstream) for sid in ("a", "b", "c")}

    async def ask(sid: str, n: int) -> tuple[str, str]:
        if n % 2:  # the header mode
            reply = await post(client, gateway.url + "/v1", chat([user(f"{sid}{n}")]), {SESSION_HEADER: sid})
        else:
            reply = await post(client, gateway.base_url(sid), chat([user(f"{sid}{n}")]))
        assert reply[0] == 200
        return f"{sid}{n}", reply[1]["choices"][0]["message"]["content"]

    answers = await asyncio.gather(*(ask(sid, n) for sid in sessions for n in range(4)))
    assert all(answer == "re " + asked for asked, answer in answers)
    for sid, session in sessions.items():
        asked = sorted(c.request["messages"][0]["content"] for c in session.calls)
        assert asked == [f"{sid}{n}" for n in range(4)]
        assert [c.index for c in session.calls] == [0, 1, 2, 3]
        assert all(c.response["choices"][0]["message"]["content"].startswith(f"re {sid}") for c in session.calls)

    gateway.close("b")
    assert (await post(client, gateway.base_url("b"), chat()))[0] == 404
    assert (await post(client, gateway.url + "/v1", chat(), {SESSION_HEADER: "b"}))[0] == 404
    assert (await post(client, gateway.base_url("a"), chat([user("a9")])))[0] == 200
    assert len(sessions["b"].calls) == 4 and len(sessions["a"].calls) == 5
    for unknown, headers in ((gateway.base_url("nope"), None), (gateway.url + "/v1", None)):
        status, body, _ = await post(client, unknown, chat(), headers)
        assert status == 404 and body["error"]["type"] == "session_not_found"
    assert len(chats(server)) == 13

    server.add(hang(FOREVER))  # closing a session answers its waiting call at once
    waiting = asyncio.ensure_future(post(client, gateway.base_url("c"), chat()))
    while len(chats(server)) < 14:
        await asyncio.sleep(0.01)
    gateway.close("c")
    status, body, _ = await asyncio.wait_for(waiting, 1.0)
    assert status == 404 and body["error"]["type"] == "session_ended"
    assert sessions["c"].end_reason == "closed" and sessions["c"].calls[-1].status == 404


def user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


# -- token fields and samples -------------------------------------------------------------------------


@bounded()
async def test_token_fields_are_asked_for_and_dropped_once_rejected(server, gateway, upstream_http, client):
    tracked = gateway.open("t", forward(server, upstream_http))
    assert (await post(client, gateway.base_url("t"), chat()))[0] == 200
    assert chats(server)[0]["return_token_ids"] is True and chats(server)[0]["logprobs"] is True
    call = tracked.calls[0]
    assert call.prompt_ids == encode(render_chat(MESSAGES)) and call.completion_ids == encode("ok")
    assert call.logprobs == [token_logprob(i) for i in encode("ok")] and call.notes == []

    server.script.reject_fields.add("return_token_ids")
    hosted = gateway.open("h", forward(server, upstream_http))
    status, body, _ = await post(client, gateway.base_url("h"), chat())
    assert status == 200 and "prompt_token_ids" not in body
    sent = chats(server)[1:]
    assert len(sent) == 2 and "return_token_ids" in sent[0] and "return_token_ids" not in sent[1]
    assert sent[1]["logprobs"] is True
    assert any("return_token_ids" in note for note in hosted.calls[0].notes)
    assert "return_token_ids" not in hosted.calls[0].request

    assert (await post(client, gateway.base_url("h"), chat()))[0] == 200
    assert len(chats(server)) == 4 and "return_token_ids" not in chats(server)[3]  # remembered
    assert hosted.calls[1].notes == []
    merged = hosted.merged()
    assert (merged.untracked, merged.segments) == (2, [])

    # the harness's own field is the harness's business: not dropped, the 400 passes through
    status, body, _ = await post(client, gateway.base_url("h"), chat(return_token_ids=True))
    assert status == 400 and "return_token_ids" in body["error"]["message"]
    assert len(chats(server)) == 5


@bounded()
async def test_a_harness_field_rejected_is_not_taken_for_a_token_field(server, gateway, upstream_http, client):
    server.script.reject_fields.add("top_logprobs")  # its message names "top_logprobs", not "logprobs"
    session = gateway.open("h", forward(server, upstream_http))
    status, body, _ = await post(client, gateway.base_url("h"), chat(top_logprobs=2))
    assert status == 400 and "top_logprobs" in body["error"]["message"]
    assert len(chats(server)) == 1 and session.calls[0].notes == []  # not asked again
    assert (await post(client, gateway.base_url("h"), chat()))[0] == 200
    assert chats(server)[1]["logprobs"] is True and session.calls[1].logprobs is not None


@bounded()
async def test_extending_calls_merge_and_a_rewrite_breaks(server, gateway, upstream_http, client):
    server.add(text("first"), text("second"), text("third"))
    session = gateway.open("m", forward(server, upstream_http))
    turn1 = [{"role": "system", "content": "be brief"}, user("hi")]
    turn2 = [*turn1, {"role": "assistant", "content": "first"}, user("more")]
    for messages in (turn1, turn2):
        assert (await post(client, gateway.base_url("m"), chat(messages)))[0] == 200
    prompt0, prompt1 = encode(render_chat(turn1)), encode(render_chat(turn2))
    completion0, completion1 = encode("first"), encode("second")
    bridge = prompt1[len(prompt0) + len(completion0) :]
    assert prompt1[: len(prompt0) + len(completion0)] == prompt0 + completion0
    merged = session.merged()
    assert (merged.breaks, len(merged.segments), merged.segments[0].bridges) == (0, 1, 1)
    (segment,) = merged.segments
    assert segment.ids == prompt0 + completion0 + bridge + completion1
    assert segment.mask == [0] * len(prompt0) + [1] * len(completion0) + [0] * len(bridge) + [1] * len(completion1)
    assert segment.logprobs[len(prompt0) : len(prompt0) + len(completion0)] == [token_logprob(i) for i in completion0]

    assert (await post(client, gateway.base_url("m"), chat([user("start over")])))[0] == 200
    merged = session.merged()
    assert (merged.breaks, len(merged.segments), merged.break_rate) == (1, 2, 0.5)
    assert merged.segments[1].ids == encode(render_chat([user("start over")])) + encode("third")
    assert merged.segments[0].bridge_breaks == 1 and merged.segments[1].reason == "bridge_break"


# -- requests the gateway refuses, what it reports, what it forces ------------------------------------


@bounded()
async def test_stream_and_bad_bodies_are_400_and_calls_are_served(server, gateway, upstream_http, client):
    session = gateway.open("r", forward(server, upstream_http))
    for body in (chat(stream=True), b"{not json", b"[1, 2]"):
        status, answer, _ = await post(client, gateway.base_url("r"), body)
        assert status == 400 and answer["error"]["type"] == "invalid_request_error"
    assert chats(server) == []
    assert [c.status for c in session.calls] == [400]  # the stream call reached the session
    assert (await post(client, gateway.base_url("r"), chat()))[0] == 200
    async with client.get(gateway.url + "/sessions/r/calls") as response:
        assert response.status == 200
        report = await response.json()
    assert report["session"] == "r" and [c["status"] for c in report["calls"]] == [400, 200]
    assert report["calls"][1]["completion_ids"] == encode("ok")
    assert [s["ids"] for s in report["samples"]] == [encode(render_chat(MESSAGES)) + encode("ok")]
    assert report["breaks"] == 0 and report["untracked"] == 0
    async with client.get(gateway.url + "/sessions/nope/calls") as response:
        assert response.status == 404


@bounded()
async def test_forced_settings_override_the_harness(server, gateway, upstream_http, client):
    session = gateway.open("f", forward(server, upstream_http, forced={"temperature": 0.0}))
    assert (await post(client, gateway.base_url("f"), chat(temperature=1.3, max_tokens=7)))[0] == 200
    (sent,) = chats(server)
    assert sent["temperature"] == 0.0 and sent["max_tokens"] == 7
    assert session.calls[0].request["temperature"] == 0.0


@bounded()
async def test_aclose_ends_waiting_calls_and_stops_listening(server, upstream_http, client):
    gateway = await Gateway().start()
    session = gateway.open("w", forward(server, upstream_http))
    server.add(hang(FOREVER))
    waiting = asyncio.ensure_future(post(client, gateway.base_url("w"), chat()))
    while not chats(server):
        await asyncio.sleep(0.01)
    await gateway.aclose()
    status, body, _ = await asyncio.wait_for(waiting, 2.0)
    assert status == 404 and body["error"]["type"] == "session_ended"
    assert session.end_reason == "gateway_closed"
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", gateway.port)


# -- shapes and merge_calls (pure) ---------------------------------------------------------------------


def assistant(content: Any, arguments: Any = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if arguments is not None:
        message["tool_calls"] = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}]
    return message


def test_same_message_compares_meaning():
    assert same_message(assistant(None), assistant(""))
    assert same_message(assistant("", '{"x": 1, "y": [2]}'), {**assistant(None, {"y": [2], "x": 1}), "extra": 5})
    assert same_message(assistant([{"type": "text", "text": "hi"}]), assistant("hi"))
    assert not same_message(assistant("", '{"x": 1}'), assistant("", '{"x": 2}'))
    assert not same_message(assistant("hi"), user("hi"))
    assert not same_message({"role": "tool", "content": "", "tool_call_id": "a"}, {"role": "tool", "tool_call_id": "b"})


def test_extends_needs_the_history_and_more():
    history = [user("hi"), assistant(None, '{"x": 1}')]
    assert extends(history, [user("hi"), assistant("", {"x": 1}), user("next")])
    assert not extends(history, [user("hi"), assistant("", {"x": 1})])  # nothing added
    assert not extends(history, [user("hello"), assistant("", {"x": 1}), user("next")])
    assert extends([], [user("hi")])


def test_chat_response_carries_the_token_fields():
    completion = Completion(
        content="",
        tool_calls=[ToolCall("c1", "f", '{"x": 1}')],
        finish_reason="stop",
        message={},
        prompt_tokens=3,
        completion_tokens=2,
        prompt_ids=[1, 2, 3],
        completion_ids=[4, 5],
        logprobs=[-0.1, -0.2],
    )
    body = chat_response(completion, "m", created=7)
    (choice,) = body["choices"]
    assert (body["model"], body["created"], body["object"]) == ("m", 7, "chat.completion")
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}
    assert body["prompt_token_ids"] == [1, 2, 3] and choice["token_ids"] == [4, 5]
    assert [item["logprob"] for item in choice["logprobs"]["content"]] == [-0.1, -0.2]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    plain = chat_response(Completion("hi", [], "length", {}), "m")
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    assert plain["choices"][0]["finish_reason"] == "length" and plain["choices"][0]["message"]["content"] == "hi"


def answered(index: int, prompt: list[int] | None, completion: list[int] | None, logprobs=None, status=200) -> Call:
    return Call(index, CHAT_PATH, {}, status, prompt_ids=prompt, completion_ids=completion, logprobs=logprobs)


def test_merge_calls_skips_failures_and_counts():
    calls = [
        answered(3, [9], [8], [-0.3]),  # out of order: merged by index
        answered(1, [7], [6], [-0.1], status=429),  # not answered: skipped
        answered(0, [1, 2], [3], [-0.5]),
        answered(2, [1, 2, 3, 4], [5]),  # extends, no log-probs
    ]
    merged = merge_calls(calls)
    first, second = merged.segments
    assert first.ids == [1, 2, 3, 4, 5] and first.mask == [0, 0, 1, 0, 1]
    assert first.logprobs == [0.0, 0.0, -0.5, 0.0, 0.0] and first.bridges == 1 and first.bridge_breaks == 1
    assert second.ids == [9, 8] and second.reason == "bridge_break"
    assert (merged.breaks, merged.without_logprobs, merged.untracked, merged.break_rate) == (1, 1, 0, 0.5)
    assert merge_calls([]).break_rate == 0.0


def test_merge_calls_untracked_ends_the_chain_without_a_break():
    merged = merge_calls([answered(0, [1], [2], [-0.1]), answered(1, None, None), answered(2, [1, 2, 3], [4], [-0.2])])
    assert (merged.untracked, merged.breaks, len(merged.segments), merged.break_rate) == (1, 0, 2, 0.0)
    assert merged.segments[1].ids == [1, 2, 3, 4]
