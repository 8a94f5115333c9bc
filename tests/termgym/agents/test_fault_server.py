"""The fault server through the real ``openai`` SDK: every reply builder parses into the SDK's typed
objects, the vLLM extras (token ids, logprobs) are consistent with the fake tokenizer, and each
fault surfaces as the SDK's own error (after the SDK's own retries where it retries)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageFunctionToolCall
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

from tests.termgym.agents.fault_server import (
    MAX_MODEL_LEN,
    MODEL,
    FaultServer,
    Reply,
    Script,
    bash,
    call,
    context_length,
    decode,
    die,
    empty,
    encode,
    error,
    hang,
    length,
    rate_limit,
    render_chat,
    reset,
    server_error,
    storm,
    text,
    token_logprob,
    tool_call,
    tool_calls,
    unknown_param,
)

MESSAGES: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "list files"}]


@pytest.fixture
async def server() -> AsyncIterator[FaultServer]:
    async with FaultServer() as running:
        yield running


def client(
    server: FaultServer, *, max_retries: int = 0, timeout: float = 5.0, api_key: str = "k"
) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.base_url, api_key=api_key, max_retries=max_retries, timeout=timeout)


async def chat(server: FaultServer, **options: Any) -> ChatCompletion:
    extra = options.pop("extra_body", None)
    async with client(server, **options) as api:
        return await api.chat.completions.create(model=MODEL, messages=MESSAGES, extra_body=extra)


def only_call(completion: ChatCompletion) -> ChatCompletionMessageFunctionToolCall:
    (tool,) = completion.choices[0].message.tool_calls or []
    assert isinstance(tool, ChatCompletionMessageFunctionToolCall)
    return tool


# -- replies ---------------------------------------------------------------------------------------


async def test_models_lists_the_model_with_its_context_length():
    async with FaultServer(model="m1", max_model_len=1234) as server, client(server) as api:
        page = await api.models.list()
    (model,) = page.data
    assert model.id == "m1" and model.object == "model" and model.owned_by == "test"
    assert (model.model_extra or {})["max_model_len"] == 1234


async def test_tool_call_reply(server):
    server.add(tool_call("run", {"command": "ls -la"}))
    completion = await chat(server)
    tool = only_call(completion)
    assert completion.object == "chat.completion" and completion.model == MODEL
    assert completion.choices[0].finish_reason == "tool_calls"
    assert tool.type == "function" and tool.function.name == "run" and tool.id
    assert json.loads(tool.function.arguments) == {"command": "ls -la"}


async def test_several_tool_calls_and_malformed_arguments(server):
    server.add(tool_calls(call("run", {"command": "pwd"}), ("run", '{"command": "ls"'), content="two"))
    message = (await chat(server)).choices[0].message
    first, second = message.tool_calls or []
    assert isinstance(first, ChatCompletionMessageFunctionToolCall)
    assert isinstance(second, ChatCompletionMessageFunctionToolCall)
    assert message.content == "two" and first.id != second.id
    assert json.loads(first.function.arguments) == {"command": "pwd"}
    assert second.function.arguments == '{"command": "ls"'  # sent as is
    with pytest.raises(json.JSONDecodeError):
        json.loads(second.function.arguments)


@pytest.mark.parametrize(
    ("reply", "content", "finish"),
    [
        (text("all done"), "all done", "stop"),
        (bash("ls /", prose=""), "```bash\nls /\n```", "stop"),
        (empty(), "", "stop"),
        (empty(None), None, "stop"),
        (length("half a thou"), "half a thou", "length"),
    ],
)
async def test_text_replies(server, reply: Reply, content: str | None, finish: str):
    server.add(reply)
    choice = (await chat(server)).choices[0]
    assert choice.message.role == "assistant" and choice.message.tool_calls is None
    assert choice.message.content == content and choice.finish_reason == finish


async def test_a_callable_answers_from_the_request(server):
    seen: list[dict[str, Any]] = []

    def echo(body: dict[str, Any]) -> Reply:
        seen.append(body)
        return tool_call("run", {"command": f"echo {body['messages'][-1]['content']!r}"})

    async def later(body: dict[str, Any]) -> Reply:
        await asyncio.sleep(0)
        return text(body["model"])

    server.add(echo, later)
    assert json.loads(only_call(await chat(server)).function.arguments) == {"command": "echo 'list files'"}
    assert (await chat(server)).choices[0].message.content == MODEL
    assert seen[0]["messages"] == MESSAGES


async def test_the_default_answers_when_the_queue_is_empty():
    script = Script(default=text("fallback")).add(text("first"))
    async with FaultServer(script=script) as server:
        contents = [(await chat(server)).choices[0].message.content for _ in range(3)]
    assert contents == ["first", "fallback", "fallback"]


async def test_chat_token_ids_and_logprobs(server):
    reply = tool_call("run", {"command": "ls"}, content="ok")
    server.add(reply, text("plain"))
    async with client(server) as api:
        completion = await api.chat.completions.create(
            model=MODEL, messages=MESSAGES, logprobs=True, extra_body={"return_token_ids": True}
        )
        plain = await api.chat.completions.create(model=MODEL, messages=MESSAGES)
    extra = completion.model_extra or {}
    choice_extra = completion.choices[0].model_extra or {}
    assert extra["prompt_token_ids"] == encode(render_chat(MESSAGES))
    assert choice_extra["token_ids"] == encode(reply.raw_text())
    assert decode(choice_extra["token_ids"]).startswith("ok\n<tool_call>\n")
    usage = completion.usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(extra["prompt_token_ids"]), len(reply.raw_text()))
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert all(isinstance(entry, ChatCompletionTokenLogprob) for entry in logprobs.content)
    assert "".join(entry.token for entry in logprobs.content) == reply.raw_text()
    assert [entry.logprob for entry in logprobs.content] == [token_logprob(i) for i in choice_extra["token_ids"]]
    assert "prompt_token_ids" not in (plain.model_extra or {}) and plain.choices[0].logprobs is None
    assert server.requests[0].body["return_token_ids"] is True and "return_token_ids" not in server.requests[1].body


async def test_completions_with_a_prompt_of_token_ids(server):
    server.add(text("ls -l"), length("cut"))
    prompt = [5, 17, 42, 99]
    async with client(server) as api:
        completion = await api.completions.create(
            model=MODEL, prompt=prompt, logprobs=1, max_tokens=8, extra_body={"return_token_ids": True}
        )
        batch = await api.completions.create(model=MODEL, prompt=["ab", "cde"])
    (choice,) = completion.choices
    assert completion.object == "text_completion" and choice.text == "ls -l" and choice.finish_reason == "stop"
    assert (completion.model_extra or {})["prompt_token_ids"] == prompt
    assert (choice.model_extra or {})["prompt_token_ids"] == prompt  # where vLLM puts it
    assert (choice.model_extra or {})["token_ids"] == encode("ls -l")
    assert choice.logprobs is not None
    assert choice.logprobs.tokens == list("ls -l") and choice.logprobs.text_offset == [0, 1, 2, 3, 4]
    assert choice.logprobs.token_logprobs == [token_logprob(i) for i in encode("ls -l")]
    assert completion.usage is not None and completion.usage.prompt_tokens == 4
    assert completion.usage.completion_tokens == 5
    assert [c.text for c in batch.choices] == ["cut", "cut"] and batch.choices[0].finish_reason == "length"
    assert batch.usage is not None and batch.usage.prompt_tokens == 5


# -- faults ----------------------------------------------------------------------------------------


async def test_429_is_retried_after_the_retry_after(server):
    server.add(rate_limit(0.05), text("after the wait"))
    completion = await chat(server, max_retries=2)
    assert completion.choices[0].message.content == "after the wait"
    first, second = server.requests
    assert (first.status, second.status) == (429, 200)
    assert first.body == second.body
    assert second.time - first.time >= 0.05 - 0.002


async def test_a_429_storm_longer_than_the_retries_surfaces(server):
    server.add(storm(3, retry_after=0.01), text("never seen by this call"))
    assert len(server.script.queue) == 4  # the storm is three entries
    with pytest.raises(openai.RateLimitError) as caught:
        await chat(server, max_retries=2)
    assert caught.value.status_code == 429 and caught.value.response.headers["retry-after"] == "0.01"
    assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "rate_limit_exceeded"
    assert [r.status for r in server.requests] == [429, 429, 429]
    assert (await chat(server)).choices[0].message.content == "never seen by this call"


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_a_5xx_storm_longer_than_the_retries_is_an_internal_server_error(server, status: int):
    server.add(server_error(status, count=3, retry_after=0.01))
    with pytest.raises(openai.InternalServerError) as caught:
        await chat(server, max_retries=2)
    assert caught.value.status_code == status
    assert [r.status for r in server.requests] == [status] * 3


async def test_a_5xx_shorter_than_the_retries_is_absorbed_and_a_raw_body_is_accepted(server):
    server.add(server_error(502, raw="<html>502 Bad Gateway</html>", retry_after=0.01), text("ok"))
    assert (await chat(server, max_retries=1)).choices[0].message.content == "ok"
    server.add(error(418, raw="<html>teapot</html>"))
    with pytest.raises(openai.APIStatusError) as caught:
        await chat(server)
    assert caught.value.status_code == 418 and "teapot" in caught.value.response.text


async def test_a_hang_times_the_client_out_and_stop_is_prompt():
    server = await FaultServer().start()
    server.add(hang())
    loop = asyncio.get_running_loop()
    with pytest.raises(openai.APITimeoutError):
        await chat(server, timeout=0.1)
    server.add(hang())
    pending = asyncio.ensure_future(chat(server, timeout=5.0))
    while len(server.requests) < 2:
        await asyncio.sleep(0.005)
    started = loop.time()
    await server.stop()
    assert loop.time() - started < 0.5
    with pytest.raises(openai.APIConnectionError):
        await pending
    assert [r.status for r in server.requests] == [0, 0]


async def test_a_bounded_hang_then_answers(server):
    server.add(hang(0.05, then=text("slow")))
    assert (await chat(server)).choices[0].message.content == "slow"
    assert server.requests[0].status == 200 and server.requests[0].outcome == "hang"


@pytest.mark.parametrize("hard", [True, False])
async def test_a_reset_is_a_connection_error_and_the_server_lives_on(server, hard: bool):
    server.add(reset(hard=hard), text("back"))
    with pytest.raises(openai.APIConnectionError) as caught:
        await chat(server)
    assert not isinstance(caught.value, openai.APITimeoutError)
    assert (await chat(server)).choices[0].message.content == "back"
    assert [r.status for r in server.requests] == [0, 200]


async def test_die_mid_run_refuses_every_later_connection(server):
    server.add(die(), text("unreachable"))
    with pytest.raises(openai.APIConnectionError):
        await chat(server)
    assert server.dead
    with pytest.raises(openai.APIConnectionError):
        await chat(server)
    assert len(server.requests) == 1  # the second never reached the server
    await server.revive()
    assert (await chat(server)).choices[0].message.content == "unreachable"


async def test_die_from_the_test_cuts_a_request_in_flight(server):
    server.add(hang())
    pending = asyncio.ensure_future(chat(server))
    while not server.requests:
        await asyncio.sleep(0.005)
    await server.die()
    with pytest.raises(openai.APIConnectionError):
        await pending
    async with client(server) as api:
        with pytest.raises(openai.APIConnectionError):
            await api.models.list()


async def test_fields_a_hosted_api_rejects(server):
    server.script.reject_fields = {"return_token_ids", "logprobs"}
    with pytest.raises(openai.BadRequestError) as caught:
        await chat(server, extra_body={"return_token_ids": True})
    assert caught.value.message.endswith("Unrecognized request argument supplied: return_token_ids")
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "invalid_request_error"
    assert (await chat(server)).choices[0].message.content == "ok"  # without the field
    server.script.reject_fields = set()
    server.add(unknown_param("logprobs"))
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: logprobs"):
        await chat(server)


async def test_context_length_errors(server):
    server.add(context_length(requested=5000))
    with pytest.raises(openai.BadRequestError) as caught:
        await chat(server)
    assert caught.value.status_code == 400
    assert caught.value.message.startswith("Error code: 400")
    assert f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you requested 5000 tokens" in (
        caught.value.message
    )
    assert isinstance(caught.value.body, dict) and caught.value.body["type"] == "BadRequestError"
    assert caught.value.body["code"] == 400

    server.script.enforce_context_length = True
    prompt = len(render_chat(MESSAGES))
    async with client(server) as api:
        ok = await api.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=MAX_MODEL_LEN - prompt)
        assert ok.choices[0].message.content == "ok"
        with pytest.raises(openai.BadRequestError, match=f"requested {MAX_MODEL_LEN + 1} tokens"):
            await api.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=MAX_MODEL_LEN - prompt + 1)


async def test_the_api_key_is_checked_before_the_script():
    async with FaultServer(api_key="sekret") as server:
        server.add(text("for the key holder"))
        with pytest.raises(openai.AuthenticationError) as caught:
            await chat(server, api_key="wrong")
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "invalid_api_key"
        assert (await chat(server, api_key="sekret")).choices[0].message.content == "for the key holder"
        assert [r.status for r in server.requests] == [401, 200]
        assert server.requests[1].headers["authorization"] == "Bearer sekret"


async def test_models_faults_have_their_own_queue(server):
    server.script.models_queue.append(server_error(503))
    server.add(text("chat is unaffected"))
    async with client(server) as api:
        with pytest.raises(openai.InternalServerError):
            await api.models.list()
        assert (await api.models.list()).data[0].id == MODEL
    assert (await chat(server)).choices[0].message.content == "chat is unaffected"


async def test_what_the_server_refuses_is_in_the_error_envelope(server):
    async with client(server) as api:
        with pytest.raises(openai.BadRequestError, match="Streaming is not supported"):
            await api.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
        with pytest.raises(openai.NotFoundError) as caught:
            await api.embeddings.create(model=MODEL, input="x")
    assert isinstance(caught.value.body, dict) and caught.value.body["message"] == "Not Found"
    assert [r.outcome for r in server.requests] == ["reject", ""] and not server.script.queue
