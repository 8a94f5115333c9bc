"""Training on every model architecture, and what each renderer family's thinking retention costs.

1. ``termgym train --model DIR`` on a tiny random policy of each architecture of
   ``trainer/architectures.py`` (slow): two PPO steps through the real command line with tool
   calls and ``--thinking all``; every prefix is kept (one sample per episode, no bridge break, no
   token drift), the prompt with the renderer's tools block fits, routing is recorded and replayed
   (R3) exactly for the MoE architectures, the trainer reproduces the sampler's log-probs, and the
   saved ``OUT/policy`` loads as the architecture's class with its renderer family detected from
   its files.
2. Scripted replies in each renderer family's canonical ids (reasoning and a tool call, or a
   fenced command), through ``run_policy_episode`` on a fake env: where each retention keeps the
   prefix and where it starts a new segment, each new segment's prompt being the full render of
   the history with the dropped reasoning gone; Qwen3.5's open think block as its renderer's
   docstring describes it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from termgym.agents.actions import SUBMIT_TEXT, TOOLS
from termgym.agents.model import LoopSettings
from termgym.agents.renderers import (
    ChatMLRenderer,
    Llama3Renderer,
    QwenXMLRenderer,
    Renderer,
    make_renderer,
    renderer_for_model_dir,
)
from termgym.cli import main as termgym_main
from termgym.env import SUBMIT
from termgym.tasks.bundled import bundled_root
from termgym.trainer.architectures import (
    ARCHITECTURE_CLASSES,
    ARCHITECTURE_MODEL_TYPES,
    ARCHITECTURES,
    MOE_ARCHITECTURES,
    build_architecture_policy,
)
from termgym.trainer.models import corpus_texts, load_policy
from termgym.trainer.rollout import RolloutSettings, run_policy_episode
from termgym.trainer.sampler import Sampler, TokenSampler
from termgym.trainer.tokenizer import train_family_tokenizer
from termgym.trainer.trajectory import Trajectory, token_drift
from tests.trainer.fake_env import FakeEnv

# the renderer family (chat format) of each architecture (trainer/tokenizer.py)
RENDERER_OF = {"qwen3": "chatml", "qwen3-moe": "chatml", "qwen3.5-moe": "qwen-xml", "llama": "llama3"}
# the text every prompt ends with: the family's generation prompt (Qwen3.5's opens the think block)
GENERATION_PROMPTS = {
    "chatml": "<|im_start|>assistant\n",
    "qwen-xml": "<|im_start|>assistant\n<think>\n",
    "llama3": "<|start_header_id|>assistant<|end_header_id|>\n\n",
}
OPENINGS = {"chatml": "<|im_start|>system\n", "qwen-xml": "<|im_start|>system\n", "llama3": "<|begin_of_text|>"}

TASKS = ["archives/extract-configs", "file-ops/organize-by-extension"]  # quick bundled tasks (test_ppo.py)
MAX_CONTEXT = 2048  # the tools block makes the first prompt 750-850 tokens
MAX_NEW_TOKENS = 16


@pytest.fixture(scope="module")
def tokenizers() -> Callable[[str], Any]:
    """The tokenizer of a renderer family, trained on the bundled tasks' text, built once."""
    texts = corpus_texts(Path(bundled_root()))
    return cache(lambda family: train_family_tokenizer(texts, family, vocab_size=1024))


# -- 1. termgym train --model DIR, per architecture ---------------------------------------------


@pytest.fixture(scope="module", params=ARCHITECTURES)
def architecture(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def architecture_policy_dir(architecture: str, tokenizers, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_architecture_policy(
        tmp_path_factory.mktemp(architecture), architecture, tokenizers(RENDERER_OF[architecture]), seed=0
    )


def train_args(out: Path, model: Path, max_new_tokens: int) -> list[str]:
    return [
        "train",
        "--preset",
        "tiny-ppo",  # critic warm-up for one step, then policy updates
        "--model",
        str(model),
        "--out",
        str(out),
        "--steps",
        "2",
        "--tasks",
        *TASKS,
        "--batch-size",
        "2",
        "--minibatch-size",
        "2",
        "--concurrency",
        "2",
        "--max-turns",
        "2",
        "--update-epochs",
        "1",
        "--action-format",
        "tool",
        "--thinking",
        "all",
        "--max-new-tokens",
        str(max_new_tokens),
        "--max-context",
        str(MAX_CONTEXT),
    ]


@pytest.fixture
def one_torch_thread():
    """The run on one intra-op thread, restored after. On a busy 2-core machine two threads wait at
    an OpenMP barrier for a descheduled peer after every small op: Qwen3.5's linear attention (no
    key/value cache; transformers' reference PyTorch kernels on CPU, thousands of small ops per
    forward) then took 35-114 s for this test against 3-5 s on one thread, the others 12-19 s
    against 2."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_termgym_train_runs_on_the_architecture(
    architecture, architecture_policy_dir, tmp_path, no_leaks, one_torch_thread
):
    out = tmp_path / "run"
    assert termgym_main(train_args(out, architecture_policy_dir, MAX_NEW_TOKENS)) == 0
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first, second = metrics
    assert (first["step"], first["warmup"], second["step"], second["warmup"]) == (0, True, 1, False)
    assert first["policy_loss"] is None and second["policy_loss"] is not None  # step 1 updated the policy
    moe = architecture in MOE_ARCHITECTURES
    for m in metrics:
        assert m["token_drift"] == 0
        # the renderer keeps every prefix when every reply keeps its reasoning
        assert m["bridge_break_rate"] == 0.0 and m["segments_per_episode"] == 1.0
        assert m["routing_recorded"] is moe and m["routing_replay"] is moe  # R3 on exactly for MoE
        if moe:
            assert m["routing_agreement"] is not None and m["routing_agreement"] >= 0.9
        else:
            assert m["routing_agreement"] is None
        assert m["logprob_gap"] < 1e-4  # the trainer's forward reproduces the sampler's log-probs
        assert 0.0 <= m["parse_error_rate"] <= 1.0 and m["context_exhausted"] == 0.0
        assert m["policy_versions"] == [m["step"]]
        assert m["action_tokens"] > 0 and m["scheduler"]["kept"] == 2

    policy, tokenizer = load_policy(out / "policy")
    lines = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    assert len(lines) == 4
    name = RENDERER_OF[architecture]
    for step in (0, 1):
        episodes = [t for t in lines if t["step"] == step]
        # two replies per episode: a bridge each, so the break rate above measured something
        assert sum(t["bridges"] for t in episodes) >= 1 and sum(t["bridge_breaks"] for t in episodes) == 0
    prompt_lengths = []
    for trajectory in lines:
        (sample,) = trajectory["samples"]
        assert len(sample["ids"]) <= MAX_CONTEXT + 1  # at most a synthesized close past the context
        prompt_length = sample["loss_mask"].index(1)
        prompt_lengths.append(prompt_length)
        prompt = tokenizer.decode(sample["ids"][:prompt_length], skip_special_tokens=False)
        assert isinstance(prompt, str)  # one sequence, one text
        # the renderer family's framing with its tools block, ending with its generation prompt
        assert prompt.startswith(OPENINGS[name]) and prompt.endswith(GENERATION_PROMPTS[name])
        assert '"name": "bash"' in prompt and '"name": "submit"' in prompt
        if moe:
            recorded = [row for row in sample["routing"] if row is not None]
            layers, top_k = policy.config.num_hidden_layers, policy.config.num_experts_per_tok  # every layer sparse
            assert recorded and all(len(row) == layers and {len(r) for r in row} == {top_k} for row in recorded)
        else:
            assert sample["routing"] is None
    replies = sum(t["replies"] for t in lines)
    parse_errors = sum(t["parse_errors"] for t in lines)
    print(
        f"{architecture}: prompt tokens (tools block included) {sorted(set(prompt_lengths))}, "
        f"parse errors {parse_errors}/{replies}, parse_error_rate {[m['parse_error_rate'] for m in metrics]}, "
        f"routing_agreement {[m['routing_agreement'] for m in metrics]}, "
        f"logprob_gap {[m['logprob_gap'] for m in metrics]}"
    )

    # the saved policy: the architecture's class and model type, updated, its renderer read from its files
    assert type(policy) is ARCHITECTURE_CLASSES[architecture]
    assert policy.config.model_type == ARCHITECTURE_MODEL_TYPES[architecture]
    start, _ = load_policy(architecture_policy_dir)
    assert any(not torch.equal(a, b) for a, b in zip(policy.state_dict().values(), start.state_dict().values()))
    renderer = renderer_for_model_dir(out / "policy")
    assert renderer.name == name
    if name == "qwen-xml":
        assert isinstance(renderer, QwenXMLRenderer) and renderer.open_think  # Qwen3.5's template writes <think>


# -- 2. thinking retention per renderer family, with scripted replies -----------------------------

# the renderers: each family's, and Qwen3-Coder's XML format (qwen-xml without the open think block)
VARIANTS = ("chatml", "qwen-xml", "qwen-xml-coder", "llama3")
TOKENIZER_OF = {"chatml": "chatml", "qwen-xml": "qwen-xml", "qwen-xml-coder": "qwen-xml", "llama3": "llama3"}
REASONING_PATTERNS = {"every-reply": [True, True, True, True], "mixed": [True, False, True, True]}
OBSERVATION = "a.txt\nb.txt"


def build_renderer(variant: str, tokenizers, thinking: str) -> Renderer:
    tokenizer = tokenizers(TOKENIZER_OF[variant])
    if variant == "qwen-xml-coder":
        return QwenXMLRenderer(tokenizer, thinking=cast(Any, thinking), open_think=False)
    renderer = make_renderer(variant, tokenizer, thinking=thinking)
    assert isinstance(renderer, (ChatMLRenderer, Llama3Renderer))
    return renderer


def reasoning_text(index: int) -> str:
    return f"Reply {index} reasons: the files of dir{index} come next."


def command_of(index: int) -> str:
    return f"ls /app/dir{index}"


def reply_message(index: int, reasoning: bool, submit: bool, action_format: str) -> dict[str, Any]:
    """A reply in the agent's message shape: reasoning (or none), then a bash or submit call (tool
    format) or a fenced command (text format)."""
    message: dict[str, Any] = {"role": "assistant", "content": ""}
    if reasoning:
        message["reasoning_content"] = reasoning_text(index)
    if action_format == "tool":
        call = (
            {"name": "submit", "arguments": {}}
            if submit
            else {"name": "bash", "arguments": {"command": command_of(index)}}
        )
        message["tool_calls"] = [{"id": "call_0", "type": "function", "function": call}]
    else:
        message["content"] = "```bash\n" + (SUBMIT_TEXT if submit else command_of(index)) + "\n```"
    return message


class ScriptedReplies(TokenSampler):
    """Samples the given replies' ids in order, one token per request (each reply ends with its
    close id, a stop id, so each turn is exactly one reply)."""

    def __init__(self, replies: Sequence[Sequence[int]]) -> None:
        self.script = [token for reply in replies for token in reply]

    async def sample(self, ids, generator):
        return self.script.pop(0), -0.25


def run_scripted(renderer: Renderer, replies: list[list[int]], action_format: str) -> tuple[Trajectory, FakeEnv]:
    loop = LoopSettings(action_format=cast(Any, action_format), max_tokens=256, context="none")
    rollout = RolloutSettings(loop, max_context=4096, observation_tokens=64)
    env = FakeEnv([OBSERVATION], max_turns=len(replies) + 1)
    trajectory = Trajectory(task="t")
    # the scripted double implements what an episode calls of a Sampler (generate_turn, forget, records_routing)
    sampler = cast(Sampler, ScriptedReplies(replies))
    asyncio.run(run_policy_episode(env, "List the files.", {}, sampler, renderer, rollout, None, trajectory))
    return trajectory, env


def expected_breaks(variant: str, thinking: str, action_format: str, reasoning: list[bool]) -> list[int]:
    """The replies (by index; never the last, which no reply follows) after which the prefix cannot
    be kept, as the renderers' docstrings state it."""
    if variant == "llama3" or thinking == "all":
        return []  # Llama never renders reasoning; "all" never drops any
    if thinking == "cycle" and action_format == "tool":
        return []  # tool results do not end the cycle
    # strip, or cycle with every observation a user message: the last reply's reasoning is dropped
    # from the next prompt on; Qwen3.5's open think block renders every reply by the retention
    return [i for i, has in enumerate(reasoning[:-1]) if has or variant == "qwen-xml"]


def without_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]


@pytest.mark.parametrize("pattern", sorted(REASONING_PATTERNS))
@pytest.mark.parametrize("action_format", ["tool", "text"])
@pytest.mark.parametrize("thinking", ["all", "cycle", "strip"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_thinking_retention_keeps_or_breaks_the_prefix_as_the_family_says(
    variant, thinking, action_format, pattern, tokenizers
):
    renderer = build_renderer(variant, tokenizers, thinking)
    tokenizer = renderer.tokenizer
    reasoning = REASONING_PATTERNS[pattern]
    last = len(reasoning) - 1
    messages = [reply_message(i, has, i == last, action_format) for i, has in enumerate(reasoning)]
    replies = [renderer.render_assistant(m) for m in messages]
    trajectory, env = run_scripted(renderer, replies, action_format)

    assert env.actions == [*(command_of(i) for i in range(last)), SUBMIT]  # every reply parsed and acted on
    assert trajectory.stop_reason == "submitted" and trajectory.replies == len(replies) and trajectory.parse_errors == 0
    breaks = expected_breaks(variant, thinking, action_format, reasoning)
    if thinking == "strip" and variant != "llama3":
        assert breaks  # the scripts are such that stripping breaks: the cases below would not be vacuous
    assert trajectory.bridge_breaks == len(breaks) and trajectory.bridges == last - len(breaks)
    samples = trajectory.samples
    assert len(samples) == 1 + len(breaks)
    assert [s.reason for s in samples] == ["start"] + ["bridge_break"] * len(breaks)
    assert token_drift(trajectory) == 0

    # the replies of each segment, sampled exactly (reasoning included: the model still thinks)
    firsts = [0] + [i + 1 for i in breaks]
    ends = [*firsts[1:], len(replies)]
    for sample, first, end in zip(samples, firsts, ends):
        assert sample.sampled == replies[first:end]
        assert all(sample.ids[a:b] == s for (a, b), s in zip(sample.turns, sample.sampled))

    # each segment's prompt is the full render of the history before its first reply
    history = env.transcript.segments[-1].messages  # the whole conversation (the agent writes it at the end)
    assistants = [i for i, m in enumerate(history) if m["role"] == "assistant"]
    assert len(assistants) == len(replies)
    tools = TOOLS if action_format == "tool" else None
    think_id = tokenizer.convert_tokens_to_ids("<think>")
    think_end_id = tokenizer.convert_tokens_to_ids("</think>")
    for sample, first in zip(samples, firsts):
        before = history[: assistants[first]]
        prompt = sample.ids[: sample.turns[0][0]]
        assert prompt == renderer.render(before, tools=tools)
        if first == 0:
            continue
        # a new segment: the reasoning of the reply that broke the prefix (and every earlier one) is gone
        text = tokenizer.decode(prompt, skip_special_tokens=False)
        assert all(reasoning_text(i) not in text for i in range(first))
        assert all(command_of(i) in text for i in range(first))  # the history itself is all there
        assert think_end_id not in prompt
        if variant == "qwen-xml":  # only the generation prompt's open think block
            assert prompt.count(think_id) == 1 and prompt[-2] == think_id
        else:
            assert think_id not in prompt
        if variant == "chatml":  # stripped: the same as the conversation never having had reasoning
            full = make_renderer("chatml", tokenizer, thinking="all")
            assert prompt == full.render(without_reasoning(before), tools=tools)

    if not breaks:
        # one sample, and it is the whole conversation as the renderer renders it (the prefix held)
        (sample,) = samples
        rendered = renderer.render(history, tools=tools, add_generation_prompt=False)
        assert rendered[: len(sample.ids)] == sample.ids and len(rendered) - len(sample.ids) <= 1
        text = tokenizer.decode(sample.ids, skip_special_tokens=False)
        if variant == "llama3":  # no reasoning blocks in Llama's format: none is ever rendered
            assert all(reasoning_text(i) not in text for i in range(len(reasoning)))
        elif thinking == "all":
            assert all(reasoning_text(i) in text for i, has in enumerate(reasoning) if has)


def test_qwen_xml_opens_the_think_block_in_its_generation_prompt(tokenizers):
    """What qwen_xml's docstring says of ``open_think``: the default when the tokenizer's chat
    template writes ``<think>``; the generation prompt opens the think block, a reply closes it
    (an empty block when it has no reasoning); ``open_think=False`` (Qwen3-Coder) writes reasoning
    as chatml does."""
    tokenizer = tokenizers("qwen-xml")
    assert "<think>" in tokenizer.chat_template
    renderer = make_renderer("qwen-xml", tokenizer, thinking="cycle")
    assert isinstance(renderer, QwenXMLRenderer) and renderer.open_think
    think = tokenizer.convert_tokens_to_ids("<think>")
    opening = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "List the files."}]
    prompt = renderer.render(opening, tools=TOOLS)
    assert renderer.decode(prompt).endswith("<|im_start|>assistant\n<think>\n")
    assert prompt[-2] == think and prompt[-1:] == renderer.encode("\n")  # the structural id, not text
    call = (
        "<tool_call>\n<function=bash>\n<parameter=command>\nls /app/dir0\n</parameter>\n</function>\n"
        "</tool_call><|im_end|>"
    )
    thought = renderer.render_assistant(reply_message(0, True, False, "tool"))
    assert think not in thought
    assert renderer.decode(thought) == f"{reasoning_text(0)}\n</think>\n\n{call}"
    empty = renderer.render_assistant(reply_message(0, False, False, "tool"))
    assert renderer.decode(empty) == f"\n</think>\n\n{call}"
    assert renderer.parse(thought).reasoning == reasoning_text(0) and renderer.parse(empty).reasoning == ""
    # a history turn is that same generation prompt plus the reply (the bridge stays exact); a kept
    # reply without reasoning renders its empty think block, one the retention drops renders none
    without = reply_message(0, False, False, "tool")
    history = [*opening, without, {"role": "tool", "content": OBSERVATION}]
    assert renderer.render([*opening, without], tools=TOOLS, add_generation_prompt=False)[
        : len(prompt) + len(empty)
    ] == (prompt + empty)
    turn = "<|im_start|>assistant\n"
    kept = make_renderer("qwen-xml", tokenizer, thinking="all").render(history, tools=TOOLS)
    assert renderer.decode(kept).count(f"{turn}<think>\n\n</think>\n\n<tool_call>") == 1
    dropped = make_renderer("qwen-xml", tokenizer, thinking="strip").render(history, tools=TOOLS)
    assert renderer.decode(dropped).count(f"{turn}<tool_call>") == 1
    assert dropped.count(think) == 1 and renderer.decode(dropped).endswith(f"{turn}<think>\n")

    coder = QwenXMLRenderer(tokenizer, thinking="cycle", open_think=False)
    assert coder.decode(coder.render(opening, tools=TOOLS)).endswith("<|im_start|>assistant\n")
    assert coder.decode(coder.render_assistant(reply_message(0, True, False, "tool"))) == (
        f"<think>\n{reasoning_text(0)}\n</think>\n\n{call}"
    )
    assert coder.decode(coder.render_assistant(reply_message(0, False, False, "tool"))) == call
    assert coder.parse(coder.render_assistant(reply_message(0, False, False, "tool"))).reasoning is None
