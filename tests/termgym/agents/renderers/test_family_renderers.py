"""The family renderers, attacked one property at a time on random conversations: token-exact
bridges (a segment of canonical replies and bridges is the full render, token for token, and a
bridge breaks exactly where the thinking retention rewrites an earlier turn), the rendered text is
the family's jinja template's, content never becomes a structural id, and parse reads back what
``render_assistant`` wrote."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from termgym.agents.actions import TOOLS, ToolCall
from termgym.agents.renderers import THINKING_RETENTIONS, ThinkingRetention
from termgym.agents.renderers.llama3 import read_call
from termgym.agents.renderers.qwen_xml import typed_value
from tests.termgym.agents.renderers.helpers import CONFIGS, Config

PROPERTY = settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

# pieces of text that are hard on a renderer: every family's structural spellings, JSON and XML
# punctuation, newlines that BPE merges, multi-byte characters
FRAGMENTS = (
    "ls",
    " -la",
    " ",
    "\n",
    "\n\n",
    "a",
    "é",
    "漢",
    "{",
    "}",
    '"',
    "\\",
    ":",
    "0",
    "\t",
    "```bash\n",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
    "<|im_end|>",
    "<|im_start|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<|python_tag|>",
    "<|begin_of_text|>",
    "<function=x>",
    "<parameter=y>",
)
texts = st.lists(st.sampled_from(FRAGMENTS), max_size=6).map("".join)
# argument values parse reads back as the same string (module docstring of qwen_xml)
string_values = texts.filter(lambda v: typed_value(v) == v)


@st.composite
def tool_calls(draw) -> dict[str, Any]:
    name = draw(st.sampled_from(["bash", "submit"]))
    arguments: dict[str, Any] = {}
    if name == "bash":
        arguments["command"] = draw(string_values)
        if draw(st.booleans()):
            arguments["timeout"] = draw(st.integers(1, 10_000) | st.sampled_from([0.5, 2.25]))
    return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}


@st.composite
def replies(draw, family: str) -> dict[str, Any]:
    """An assistant message of the family: Llama has no reasoning, one call or content."""
    if family == "llama3":
        if draw(st.booleans()):
            return {"role": "assistant", "content": "", "tool_calls": [draw(tool_calls())]}
        content = draw(texts.filter(lambda t: read_call(t, False) is None))
        return {"role": "assistant", "content": content}
    message: dict[str, Any] = {"role": "assistant", "content": draw(texts)}
    reasoning = draw(st.none() | texts)
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    calls = draw(st.lists(tool_calls(), max_size=2))
    if calls:
        message["tool_calls"] = calls
    return message


observation = st.builds(lambda role, text: {"role": role, "content": text}, st.sampled_from(["tool", "user"]), texts)
system_turn = st.builds(lambda text: {"role": "system", "content": text}, texts)


@st.composite
def episodes(draw, family: str) -> tuple[list[dict[str, Any]], list[dict] | None, list[tuple[dict, list[dict]]]]:
    """An opening (an optional system message and a user message), the tools or none, and turns:
    a reply then the messages that follow it (tool results, user or system messages)."""
    opening = [draw(system_turn)] if draw(st.booleans()) else []
    opening.append({"role": "user", "content": draw(texts)})
    tools = TOOLS if draw(st.booleans()) else None
    turn = st.tuples(replies(family), st.lists(observation | system_turn, min_size=1, max_size=3))
    return opening, tools, draw(st.lists(turn, min_size=1, max_size=4))


def expected_break(config: Config, thinking: str, history: list[dict], new: list[dict]) -> bool:
    """The retention rule, stated apart from the renderers: does rendering ``history + new`` change
    a turn the segment already holds?"""
    if config.family == "llama3" or thinking == "all":
        return False

    def rewritten(message: dict) -> bool:  # keeping or dropping its reasoning renders it differently
        return config.open_think or "reasoning_content" in message

    if thinking == "strip":
        return rewritten(history[-1])  # sampled with its reasoning, rendered without
    last_user = max(i for i, m in enumerate(history) if m["role"] == "user")
    ends_cycle = any(m["role"] == "user" for m in new)
    return ends_cycle and any(m["role"] == "assistant" and rewritten(m) for m in history[last_user + 1 :])


def template_text(tokenizer, config: Config, thinking: ThinkingRetention, messages, tools, generation: bool = True):
    return tokenizer.apply_chat_template(
        messages, tools=tools, add_generation_prompt=generation, tokenize=False, **config.template_kwargs(thinking)
    )


def decoded(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("thinking", THINKING_RETENTIONS)
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
def test_segments_of_canonical_replies_are_the_full_render_and_break_only_where_the_rule_says(
    tokenizers, config: Config, thinking: ThinkingRetention
):
    tokenizer = tokenizers[config.family]
    renderer = config.renderer(tokenizer, thinking)

    @PROPERTY
    @given(episodes(config.family))
    def check(episode):
        opening, tools, turns = episode
        segment = renderer.render(opening, tools=tools)
        assert decoded(tokenizer, segment) == template_text(tokenizer, config, thinking, opening, tools)
        history = list(opening)
        for reply, new in turns:
            extended = segment + renderer.render_assistant(reply)
            history.append(reply)
            bridge = renderer.bridge(history, new, tools=tools)
            full = renderer.render([*history, *new], tools=tools)
            assert decoded(tokenizer, full) == template_text(tokenizer, config, thinking, [*history, *new], tools)
            assert (bridge is None) == expected_break(config, thinking, history, new)
            if bridge is None:
                assert full[: len(extended)] != extended  # the break was needed: the prefix changed
                segment = full
            else:
                segment = extended + bridge
                assert segment == full
            history += new

    check()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
def test_rendering_without_a_generation_prompt_is_the_templates_too(tokenizers, config: Config):
    tokenizer = tokenizers[config.family]

    @PROPERTY
    @given(episodes(config.family), st.sampled_from(THINKING_RETENTIONS))
    def check(episode, thinking):
        renderer = config.renderer(tokenizer, thinking)
        opening, tools, turns = episode
        messages = [*opening, *(m for reply, new in turns for m in (reply, *new))]
        ids = renderer.render(messages, tools=tools, add_generation_prompt=False)
        assert decoded(tokenizer, ids) == template_text(tokenizer, config, thinking, messages, tools, generation=False)

    check()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
def test_content_never_becomes_a_structural_id(tokenizers, config: Config):
    tokenizer = tokenizers[config.family]
    renderer = config.renderer(tokenizer)
    structural = set(renderer.ids.values())
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    reply = {"role": "assistant", "content": "ok"}
    skeleton = renderer.render([*opening, reply, {"role": "tool", "content": ""}, {"role": "user", "content": ""}])
    expected = [i for i in skeleton if i in structural]  # the framing's own structural ids

    @PROPERTY
    @given(texts, texts, texts)
    def check(system, result, user):
        opening = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        ids = renderer.render([*opening, reply, {"role": "tool", "content": result}, {"role": "user", "content": user}])
        assert [i for i in ids if i in structural] == expected
        assert not structural & set(renderer.encode(system + result + user))

    check()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
def test_parse_reads_back_what_render_assistant_wrote(tokenizers, config: Config):
    renderer = config.renderer(tokenizers[config.family])

    @PROPERTY
    @given(replies(config.family))
    def check(message):
        parsed = renderer.parse(renderer.render_assistant(message))
        reasoning = message.get("reasoning_content")
        if config.open_think and reasoning is None:
            reasoning = ""  # the prompt opened a think block: the reply closes it, empty
        assert (parsed.content, parsed.reasoning, parsed.closed) == (message["content"], reasoning, True)
        calls = [c["function"] for c in message.get("tool_calls", [])]
        assert parsed.tool_calls == [
            ToolCall(f"call_{i}", c["name"], json.dumps(c["arguments"], ensure_ascii=False))
            for i, c in enumerate(calls)
        ]

    check()


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.id)
def test_a_reply_cut_short_parses_unclosed_and_parse_never_raises(tokenizers, config: Config):
    renderer = config.renderer(tokenizers[config.family])
    size = len(tokenizers[config.family])

    @PROPERTY
    @given(replies(config.family), st.data())
    def check(message, data):
        ids = renderer.render_assistant(message)
        cut = data.draw(st.integers(0, len(ids) - 1))
        assert renderer.parse(ids[:cut]).closed is False
        noise = data.draw(st.lists(st.integers(0, size - 1) | st.sampled_from(sorted(renderer.ids.values()))))
        renderer.parse(noise)  # any ids at all: no exception

    check()
