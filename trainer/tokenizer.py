"""Tokenizers of a chat-format family, trained here: the tests' and the tiny policies' tokenizers.

``train_family_tokenizer(texts, family)`` is a byte-level BPE (every byte string has an encoding,
decoding never fails) trained on ``texts`` plus the family's framing, with guarantees:

* every structural token of the family (``FormatSpec.special_tokens``) is one id, the pad token
  first (id 0), in the family's order; those the family's real tokenizers leave unmarked as
  special (Qwen's ``<think>``, ``<tool_call>``, ``<tool_response>`` and their closes) are left
  unmarked here too, so a tokenizer built here matches them in text as the real ones do;
* eos, pad and bos are the family's (``FormatSpec``); the chat template is the family's packaged
  template, so ``save_pretrained`` and ``AutoTokenizer.from_pretrained`` keep it, and
  ``detect_renderer`` picks the family back from the files;
* the framing (role names, the tools block, the tool-call JSON or XML skeletons, tool results,
  reasoning blocks, a ```` ```bash ```` block and ``:submit``) is in the corpus, rendered by the
  family's template from sample conversations and repeated, so it is a few tokens;
* no network, and the same inputs give the same tokenizer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import render_jinja_template

from termgym.agents.actions import SUBMIT_TEXT, TOOLS
from termgym.agents.renderers.formats import FormatSpec, format_spec

FRAMING_REPEATS = 40


def train_family_tokenizer(texts: list[str], family: str, vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """A byte-level BPE for ``family`` (``chatml``, ``qwen-xml``, ``llama3``) trained on ``texts``
    (module docstring); ``ConfigError`` for an unknown family."""
    spec = format_spec(family)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(spec.special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([*texts, *framing_texts(spec) * FRAMING_REPEATS], trainer=trainer)
    tokenizer = _unmark(tokenizer, spec.unmarked)
    named = {spec.eos, spec.pad, *([spec.bos] if spec.bos else [])}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=spec.eos,
        pad_token=spec.pad,
        bos_token=spec.bos,
        extra_special_tokens=[t for t in spec.special_tokens if t not in named and t not in spec.unmarked],
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = spec.chat_template
    return fast


def framing_texts(spec: FormatSpec) -> list[str]:
    """The family's framing as plain text: sample conversations rendered by its template, cut at
    its structural tokens (those are single ids already, not text to learn)."""
    texts = []
    for messages, tools in _samples():
        (rendered,), _ = render_jinja_template(
            conversations=[messages], tools=tools, chat_template=spec.chat_template, add_generation_prompt=True
        )
        texts += [piece for piece in _split(rendered, spec.special_tokens) if piece]
    return texts


def _samples() -> list[tuple[list[dict[str, Any]], Any]]:
    """Conversations that use every part of a format: a system prompt, the tools, reasoning, bash
    and submit calls, tool results; and the text action format's fenced block and submit."""
    opening = [{"role": "system", "content": "You are a shell agent."}, {"role": "user", "content": "List the files."}]
    bash = {"name": "bash", "arguments": {"command": "ls -la", "timeout": 30}}
    submit = {"name": "submit", "arguments": {}}
    tool_episode = [
        *opening,
        {"role": "assistant", "content": "", "reasoning_content": "I list them.", "tool_calls": [{"function": bash}]},
        {"role": "tool", "content": "exit code 0\na.txt"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": submit}]},
        {"role": "tool", "content": "submitted"},
    ]
    text_episode = [
        *opening,
        {"role": "assistant", "content": "```bash\nls -la\n```"},
        {"role": "user", "content": "exit code 0\na.txt"},
        {"role": "assistant", "content": f"```bash\n{SUBMIT_TEXT}\n```"},
    ]
    return [(tool_episode, TOOLS), (tool_episode[1:], None), (text_episode, None)]


def _split(text: str, spellings: tuple[str, ...]) -> list[str]:
    return re.split("|".join(map(re.escape, sorted(spellings, key=len, reverse=True))), text)


def _unmark(tokenizer: Tokenizer, unmarked: frozenset[str]) -> Tokenizer:
    """The tokenizer with the added tokens ``unmarked`` no longer special (still one id each)."""
    if not unmarked:
        return tokenizer
    data = json.loads(tokenizer.to_str())
    for token in data["added_tokens"]:
        if token["content"] in unmarked:
            token["special"] = False
    return Tokenizer.from_str(json.dumps(data))
