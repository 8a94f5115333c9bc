"""The tiny tool-calling chat model of the agent tests: its template's prefix property (TITO) in
token ids, its directory loading as an ordinary Hugging Face model, and (slow) its two trained
greedy replies through transformers."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch", reason="the chat model needs the train extra: pip install -e '.[train]'")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.termgym.agents.chat_model import (
    BASH_LS_CALL,
    CHECKS,
    HEAD_DIM,
    PROBE_TOOL,
    SUBMIT_CALL,
    TOOL_TOKENS,
    TOOLS,
    build_chat_model,
    chat_tokenizer,
    render_ids,
    reply_ids,
    tool_call_message,
)

SYSTEM = {"role": "system", "content": "You operate a Linux shell."}
USER = {"role": "user", "content": "List the files in /app."}
TOOL = {"role": "tool", "tool_call_id": "call_0", "content": "a.txt\nb.txt\n"}
CALL = tool_call_message("bash", {"command": "ls -la /app"})
CALLS_TWO = {
    "role": "assistant",
    "content": "Looking first.",
    "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "pwd"}'}},
        {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}},
    ],
}
CONVERSATIONS = [
    [USER],
    [SYSTEM, USER],
    [SYSTEM, USER, CALL],
    [USER, CALL, TOOL],
    [SYSTEM, USER, CALL, TOOL, TOOL],
    [SYSTEM, USER, CALL, TOOL, {"role": "assistant", "content": "Done."}],
    [SYSTEM, USER, CALLS_TWO, TOOL, TOOL, USER],
    [USER, {"role": "assistant", "content": "ok"}, USER, {"role": "assistant", "content": ""}],
]


@pytest.fixture(scope="module")
def tokenizer():
    return chat_tokenizer()


@pytest.mark.parametrize("tools", [TOOLS, None], ids=["tools", "no-tools"])
@pytest.mark.parametrize("new", [USER, TOOL], ids=["user", "tool"])
@pytest.mark.parametrize("messages", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
def test_render_is_a_token_prefix_of_the_next_prompt(tokenizer, messages, new, tools):
    """Appending a user or tool message (with the generation prompt) never re-tokenizes what came
    before, except a tool message after a tool message: both share one user turn."""
    before = render_ids(tokenizer, messages, generation_prompt=False, tools=tools)
    after = render_ids(tokenizer, [*messages, new], generation_prompt=True, tools=tools)
    if messages[-1]["role"] == "tool" and new["role"] == "tool":
        assert after[: len(before)] != before
        text = tokenizer.decode(after)
        assert text.count("<|im_start|>user\n<tool_response>") == 1
        assert text.endswith(
            "</tool_response>\n<tool_response>\na.txt\nb.txt\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        )
    else:
        assert after[: len(before)] == before
        assert after[len(before) : len(before) + 1] == [tokenizer.convert_tokens_to_ids("<|im_start|>")]


@pytest.mark.parametrize(
    "messages", [m for m in CONVERSATIONS if m[-1]["role"] in ("user", "tool")], ids=lambda m: str(len(m))
)
@pytest.mark.parametrize("reply", [BASH_LS_CALL, SUBMIT_CALL, "Done.", ""])
def test_prompt_and_sampled_reply_are_a_prefix_of_the_next_render(tokenizer, messages, reply):
    """What the model samples after the generation prompt (the reply, then ``<|im_end|>``) is what
    the template renders for that assistant message, arguments as a JSON string or as a mapping."""
    prompt = render_ids(tokenizer, messages, generation_prompt=True)
    sampled = reply_ids(tokenizer, reply)
    if reply.startswith("<tool_call>"):
        call = json.loads(reply.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
        as_string = tool_call_message(call["name"], call["arguments"])
        as_mapping = {**as_string, "tool_calls": [{"type": "function", "function": call}]}
        assistants = [as_string, as_mapping]
    else:
        assistants = [{"role": "assistant", "content": reply}]
    for assistant in assistants:
        full = render_ids(tokenizer, [*messages, assistant], generation_prompt=False)
        assert full == prompt + sampled + tokenizer("\n", add_special_tokens=False).input_ids
        follow = render_ids(tokenizer, [*messages, assistant, TOOL], generation_prompt=True)
        assert follow[: len(prompt) + len(sampled)] == prompt + sampled


def test_template_renders_hermes_tool_calls(tokenizer):
    text = tokenizer.apply_chat_template(
        [SYSTEM, USER, CALLS_TWO, TOOL, TOOL], tools=TOOLS, add_generation_prompt=True, tokenize=False
    )
    tools = "\n".join(json.dumps(tool) for tool in TOOLS)
    assert text.startswith("<|im_start|>system\nYou operate a Linux shell.\n\n# Tools\n\n")
    assert f"<tools>\n{tools}\n</tools>" in text
    assert text.endswith(
        "<|im_start|>user\nList the files in /app.<|im_end|>\n"
        "<|im_start|>assistant\nLooking first.\n"
        '<tool_call>\n{"name": "bash", "arguments": {"command": "pwd"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\na.txt\nb.txt\n\n</tool_response>\n"
        "<tool_response>\na.txt\nb.txt\n\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    bare = tokenizer.apply_chat_template([USER], add_generation_prompt=True, tokenize=False)
    assert bare == "<|im_start|>user\nList the files in /app.<|im_end|>\n<|im_start|>assistant\n"


def test_tool_tokens_are_single_ids_and_eos_is_im_end(tokenizer):
    for token in TOOL_TOKENS:
        ids = tokenizer(token, add_special_tokens=False).input_ids
        assert ids == [tokenizer.convert_tokens_to_ids(token)] and ids[0] != tokenizer.unk_token_id
    assert tokenizer.eos_token == "<|im_end|>"
    # not "special": a decode that skips special tokens keeps the tags a tool parser reads
    ids = reply_ids(tokenizer, BASH_LS_CALL)
    assert tokenizer.decode(ids, skip_special_tokens=True) == BASH_LS_CALL


def test_untrained_model_directory_loads_with_transformers(tmp_path):
    model_dir = build_chat_model(tmp_path / "model", train=False)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.head_dim == HEAD_DIM
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert (model_dir / "chat_template.jinja").is_file()
    assert render_ids(tokenizer, PROBE_TOOL, generation_prompt=True) == render_ids(
        chat_tokenizer(), PROBE_TOOL, generation_prompt=True
    )


@pytest.mark.slow
def test_trained_model_replies_with_the_expected_tool_calls(trained_chat_model):
    """Greedy decoding through transformers' ``generate``: ``ls`` after a user turn, ``submit``
    after a tool response, on conversations the model did not train on."""
    model_dir = trained_chat_model
    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32).eval()
    for messages, expected in CHECKS:
        prompt = render_ids(tokenizer, messages, generation_prompt=True)
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False)  # pyright: ignore[reportAttributeAccessIssue]  # a causal LM generates
        assert out[0, len(prompt) :].tolist() == reply_ids(tokenizer, expected), tokenizer.decode(out[0, len(prompt) :])
