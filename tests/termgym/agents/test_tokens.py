"""The tokens client's session: bridges that only tokenize what a turn adds, the synthesized close of
a reply cut short, the prefix break that starts a new segment. The tokenizer is the tests' chat
model's (a real ``transformers`` tokenizer with a chat template the project wrote); the completions
come from the local fault server with token ids fixed by the test. The renderers themselves are
tested in ``tests/termgym/agents/renderers/``."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("transformers")

from termgym.agents.renderers import TemplateRenderer
from termgym.agents.tokens import TokensClient
from termgym.agents.transport import Endpoint, Server
from termgym.transcript import Transcript
from tests.termgym.agents.chat_model import chat_tokenizer
from tests.termgym.agents.fault_server import FaultServer, Reply

OPENING = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "List the files."}]


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


async def test_a_session_appends_bridges_and_closes_a_reply_cut_short(tokenizer):
    close = tokenizer.eos_token_id
    first = tokenizer("hello", add_special_tokens=False).input_ids  # cut short: no close token
    second = [*tokenizer("done", add_special_tokens=False).input_ids, close]
    async with FaultServer() as server:
        server.add(Reply(content="hello", finish_reason="length", token_ids=tuple(first)))
        server.add(Reply(content="done", token_ids=tuple(second)))
        client = TokensClient(Server(Endpoint(server.base_url, "test-model")), TemplateRenderer(tokenizer))
        transcript = Transcript()
        session = client.session(transcript)
        messages = [dict(m) for m in OPENING]
        deadline = time.monotonic() + 30
        one = await session.complete(messages, tools=None, max_tokens=32, deadline=deadline)
        messages += [one.message, {"role": "user", "content": "go on"}]
        two = await session.complete(messages, tools=None, max_tokens=32, deadline=deadline)
        await client.aclose()
    segment = transcript.segment
    assert one.prompt_ids is not None
    assert one.bridge is None and one.prompt_ids == TemplateRenderer(tokenizer).render(OPENING)
    assert two.bridge is not None and two.bridge[0] == close  # the synthesized close of the cut reply
    assert segment.ids == one.prompt_ids + first + two.bridge + second
    assert segment.mask == [0] * len(one.prompt_ids) + [1] * len(first) + [0] * len(two.bridge) + [1] * len(second)
    sent = [r.body["prompt"] for r in server.requests_to("completions")]
    assert sent == [one.prompt_ids, one.prompt_ids + first + two.bridge]  # token ids, never re-rendered text
    assert two.content == "done" and segment.bridges == 1 and segment.bridge_breaks == 0
    assert len(segment.logprobs) == len(segment.ids)
