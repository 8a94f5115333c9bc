"""Cases the random tests do not aim at, one per row: replies a model writes off the canonical
layout (unreadable calls, literal tags in text, unclosed reasoning, XML without closing tags,
Llama's ``<|python_tag|>``), the XML value typing, what the renderers refuse, and the retention
rule on short, readable conversations."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from termgym.agents.actions import TOOLS, ToolCall
from termgym.agents.renderers import ChatMLRenderer, Llama3Renderer, QwenXMLRenderer
from termgym.agents.renderers.qwen_xml import typed_value

OPENING = [{"role": "user", "content": "Fix it."}]


def call(name: str, arguments) -> dict:
    return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": arguments}}


def thinking_reply(reasoning: str | None = "why") -> dict:
    message = {"role": "assistant", "content": "", "tool_calls": [call("bash", {"command": "ls"})]}
    return message if reasoning is None else {**message, "reasoning_content": reasoning}


# -- parsing off the canonical layout ---------------------------------------------------------------


def test_chatml_keeps_an_unreadable_call_raw_and_renders_it_back_as_sampled(tokenizers):
    renderer = ChatMLRenderer(tokenizers["chatml"])
    ids = renderer.render_assistant({"role": "assistant", "content": "", "tool_calls": [call("", '\n{"name": bash\n')]})
    parsed = renderer.parse(ids)
    assert parsed.tool_calls == [ToolCall("call_0", None, '\n{"name": bash\n')]
    # the session writes such a call back with no name and the raw text: the same ids
    message = {"role": "assistant", "content": parsed.content, "tool_calls": [call("", parsed.tool_calls[0].arguments)]}
    assert renderer.render_assistant(message) == ids


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("see <tool_call> here", "see <tool_call> here", []),  # text, not the token: content
        (
            '<tool_call>{"name": "bash", "arguments": {}}</tool_call>',
            '<tool_call>{"name": "bash", "arguments": {}}</tool_call>',
            [],
        ),
    ],
)
def test_chatml_literal_tags_in_text_are_content(tokenizers, text, content, calls):
    renderer = ChatMLRenderer(tokenizers["chatml"])
    parsed = renderer.parse([*renderer.encode(text), renderer.close_id])
    assert (parsed.content, parsed.tool_calls) == (content, calls)


def test_chatml_reads_calls_by_their_tokens_off_the_canonical_layout(tokenizers):
    renderer = ChatMLRenderer(tokenizers["chatml"])
    ids = renderer.ids
    body = renderer.encode('{"name": "bash", "parameters": {"command": "pwd"}}')
    reply = [*renderer.encode("Run:"), ids["<tool_call>"], *body, ids["</tool_call>"], *renderer.encode(" then stop")]
    parsed = renderer.parse([*reply, ids["<|endoftext|>"]])  # <|endoftext|> is a stop id too
    assert parsed.closed and parsed.content == "Run:\nthen stop"
    assert parsed.tool_calls == [ToolCall("call_0", "bash", '{"command": "pwd"}')]
    unclosed = renderer.parse([ids["<tool_call>"], *renderer.encode('\n{"name": "submit", "arguments": {}}\n')])
    assert unclosed.tool_calls == [ToolCall("call_0", "submit", "{}")] and unclosed.closed is False


def test_chatml_reasoning_that_never_closes_is_all_reasoning(tokenizers):
    renderer = ChatMLRenderer(tokenizers["chatml"])
    ids = [renderer.ids["<think>"], *renderer.encode("\nhmm <tool_call>"), renderer.ids["<tool_call>"]]
    parsed = renderer.parse(ids)
    assert (parsed.content, parsed.reasoning, parsed.tool_calls, parsed.closed) == (
        "",
        "hmm <tool_call><tool_call>",
        [],
        False,
    )


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("30", 30),
        ("1.5", 1.5),
        ("-2e3", -2000.0),
        ('{"a": [1]}', {"a": [1]}),
        ("[1, 2]", [1, 2]),
        ("true", "true"),  # a shell command too: stays a string
        ("false", "false"),
        ("null", "null"),
        ("01", "01"),
        ("1e999", "1e999"),  # not a finite number
        ("{ ls; }", "{ ls; }"),  # a shell group, not JSON
        ("[ -f x ]", "[ -f x ]"),
        ("", ""),
        ("ls -la", "ls -la"),
    ],
)
def test_xml_values_are_typed_without_a_schema(text, value):
    assert typed_value(text) == value and type(typed_value(text)) is type(value)


def test_xml_writes_non_strings_as_json_and_reads_off_layout_calls(tokenizers):
    renderer = QwenXMLRenderer(tokenizers["qwen-xml"], open_think=False)
    ids = renderer.render_assistant(
        {"role": "assistant", "content": "", "tool_calls": [call("f", {"b": True, "n": None})]}
    )
    assert "<parameter=b>\ntrue\n</parameter>\n<parameter=n>\nnull\n</parameter>" in renderer.decode(ids)
    read = renderer._read_call  # one call body as the text between the call tokens
    assert read(0, "\n<function=bash>\n<parameter=command>\nls -la\n</function>\n") == ToolCall(
        "call_0", "bash", '{"command": "ls -la"}'
    )  # no </parameter>: the value runs to the end of the function
    inline = "\n<function=bash>\n<parameter=command>\necho '</parameter>' x\n</parameter>\n</function>\n"
    assert json.loads(read(1, inline).arguments) == {"command": "echo '</parameter>' x"}
    assert read(2, "\n<functio=bash>\n") == ToolCall("call_2", None, "\n<functio=bash>\n")
    assert read(3, "<function=submit></function>") == ToolCall("call_3", "submit", "{}")


def test_qwen_xml_with_an_open_think_block_reads_a_reply_that_never_closes_it(tokenizers):
    renderer = QwenXMLRenderer(tokenizers["qwen-xml"], open_think=True)
    parsed = renderer.parse(renderer.encode("still thinking"))
    assert (parsed.content, parsed.reasoning, parsed.closed) == ("", "still thinking", False)
    ids = renderer.render_assistant({"role": "assistant", "content": "done"})
    assert renderer.decode(ids) == "\n</think>\n\ndone<|im_end|>"  # after the prompt's <think>\n


@pytest.mark.parametrize(
    ("text", "tagged", "content", "call"),
    [
        (
            '{"name": "bash", "parameters": {"command": "ls"}}',
            False,
            "",
            ToolCall("call_0", "bash", '{"command": "ls"}'),
        ),
        (' {"name": "submit"} ', False, "", ToolCall("call_0", "submit", "{}")),
        ('{"name": "bash", "arguments": {"command": "ls"}}', True, "", ToolCall("call_0", "bash", '{"command": "ls"}')),
        (
            '{"name": "bash", "parameters": {}} and more',
            False,
            "",
            ToolCall("call_0", None, '{"name": "bash", "parameters": {}} and more'),
        ),
        ("print(1)", True, "", ToolCall("call_0", None, "print(1)")),
        ('{"answer": 1}', False, '{"answer": 1}', None),
        ("{ ls; }", False, "{ ls; }", None),
    ],
)
def test_llama_reads_the_whole_reply_as_one_call_or_content(tokenizers, text, tagged, content, call):
    renderer = Llama3Renderer(tokenizers["llama3"])
    prefix = [renderer.ids["<|python_tag|>"]] if tagged else []
    parsed = renderer.parse([*prefix, *renderer.encode(text), renderer.ids["<|eom_id|>"]])
    assert (parsed.content, parsed.tool_calls, parsed.closed) == (content, [call] if call else [], True)


def test_llama_refuses_two_calls_or_a_call_with_content(tokenizers):
    renderer = Llama3Renderer(tokenizers["llama3"])
    two = {"role": "assistant", "content": "", "tool_calls": [call("bash", {}), call("submit", {})]}
    with pytest.raises(ValueError, match="one tool call, not 2"):
        renderer.render_assistant(two)
    with pytest.raises(ValueError, match="must have no content"):
        renderer.render_assistant({"role": "assistant", "content": "x", "tool_calls": [call("submit", {})]})


def test_roles_a_family_does_not_have_are_refused(tokenizers):
    for renderer in (ChatMLRenderer(tokenizers["chatml"]), Llama3Renderer(tokenizers["llama3"])):
        with pytest.raises(ValueError, match="has no 'developer' messages"):
            renderer.render([{"role": "developer", "content": "x"}])


# -- the retention rule, on readable conversations --------------------------------------------------


def test_cycle_keeps_reasoning_through_tool_results_and_breaks_at_a_user_turn(tokenizers):
    renderer = ChatMLRenderer(tokenizers["chatml"], thinking="cycle")
    history = [*OPENING, thinking_reply()]
    assert renderer.bridge(history, [{"role": "tool", "content": "a"}]) is not None
    assert renderer.bridge(history, [{"role": "tool", "content": "a"}, {"role": "user", "content": "b"}]) is None
    # no reply since the last user turn carries reasoning: nothing to drop, the user turn bridges
    assert renderer.bridge([*OPENING, thinking_reply(None)], [{"role": "user", "content": "b"}]) is not None


def test_strip_breaks_at_a_reply_with_reasoning_only(tokenizers):
    renderer = ChatMLRenderer(tokenizers["chatml"], thinking="strip")
    earlier = [*OPENING, thinking_reply(), {"role": "tool", "content": "a"}]
    assert renderer.bridge([*earlier, thinking_reply()], [{"role": "tool", "content": "b"}]) is None
    # the earlier reasoning was stripped when the segment restarted: a reply without any bridges
    history = [*earlier, thinking_reply(None)]
    bridge = renderer.bridge(history, [{"role": "tool", "content": "b"}])
    assert bridge is not None
    segment = renderer.render(earlier) + renderer.render_assistant(thinking_reply(None)) + bridge
    assert segment == renderer.render([*history, {"role": "tool", "content": "b"}])


def test_all_never_breaks_and_keeps_every_reasoning(tokenizers):
    renderer = ChatMLRenderer(tokenizers["chatml"], thinking="all")
    history = [*OPENING, thinking_reply("first"), {"role": "user", "content": "b"}, thinking_reply("second")]
    assert renderer.bridge(history, [{"role": "user", "content": "c"}]) is not None
    text = renderer.decode(renderer.render(history))
    assert "first" in text and "second" in text


def test_a_bridge_refuses_an_assistant_message_and_needs_a_reply_to_follow(tokenizers):
    renderer = ChatMLRenderer(tokenizers["chatml"])
    assert renderer.bridge([*OPENING, thinking_reply()], [{"role": "assistant", "content": "x"}]) is None
    with pytest.raises(ValueError, match="history must end with an assistant message"):
        renderer.bridge(OPENING, [{"role": "tool", "content": "a"}])


def test_a_qwen25_tokenizer_without_think_tokens_renders_reasoning_as_text(tokenizers):
    """Qwen2.5 has <tool_call> but no <think> or <tool_response>: those are written as text."""
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"]
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(["user assistant ls"] * 4, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = tokenizers["chatml"].chat_template
    renderer = ChatMLRenderer(tokenizer)
    messages = [*OPENING, thinking_reply(), {"role": "tool", "content": "a"}]
    tools: Any = TOOLS
    ids = renderer.render(messages, tools=tools)
    assert renderer.decode(ids) == tokenizer.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    parsed = renderer.parse(renderer.render_assistant(thinking_reply()))
    assert parsed.reasoning is None and parsed.content.startswith("<think>\nwhy\n</think>")
    assert parsed.tool_calls == [ToolCall("call_0", "bash", '{"command": "ls"}')]
