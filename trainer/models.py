"""Policy, tokenizer and critic: built locally, saved and loaded as ordinary Hugging Face directories.

Guarantees: nothing here touches the network (``HF_HUB_OFFLINE=1`` is set before any load, and every
load is ``local_files_only`` from a directory); ``build_tiny_policy`` writes a directory that
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load like any other;
the tokenizer is a byte-level BPE, so every byte string has an encoding and decoding never fails.
Not guaranteed: that the tiny policy does anything useful (it is randomly initialised).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it

from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.utils import logging as hf_logging

from termgym.agents.renderers import Renderer, renderer_for_model_dir
from termgym.errors import ConfigError

from .tokenizer import train_family_tokenizer

hf_logging.disable_progress_bar()  # loading a local directory needs no progress bar

TINY_FAMILY = "chatml"  # the tiny policy's chat format: ChatML with Qwen3's special tokens

# Words a shell agent types, so that they are single tokens even if no bundled task uses them.
SHELL_VOCABULARY = """
ls cd pwd cat echo printf grep egrep sed awk sort uniq wc head tail cut tr tee xargs find mkdir rmdir
rm cp mv ln chmod chown touch tar gzip gunzip zcat bzip2 xz unzip zip diff patch cmp comm join paste
column basename dirname realpath readlink stat file du df date sleep true false test export unset
env which type command source bash sh python3 jq sha256sum md5sum base64 od hexdump seq yes nl fold
if then else elif fi for while until do done case esac function return exit local read set shift
$HOME /app /tmp /etc /var/log /usr/bin 2>/dev/null > >> < | && || ; $( ) ${ } "$@" -r -f -n -e -v
-l -a -h -p -type -name -exec -print0 -0 -i -k -t -d -s -c -o --help --version :submit
"""


def corpus_texts(envs_root: Path) -> list[str]:
    """The bundled tasks' text a tokenizer learns from: instructions, solutions, Dockerfiles and
    task files (never the verifiers' tests), in a fixed order, plus the shell vocabulary."""
    texts = []
    for path in sorted(envs_root.rglob("*")):
        relative = path.relative_to(envs_root).parts
        if not path.is_file() or "tests" in relative:  # the verifiers stay unseen
            continue
        if path.name in ("instruction.md", "Dockerfile", "task.toml", "task.yaml") or "solution" in relative:
            try:
                texts.append(path.read_text(encoding="utf-8"))
            except UnicodeDecodeError:
                continue
    # Repeated so that its words win BPE merges over rarer task text, both mid-line (" grep") and
    # at the start of a command ("grep").
    words = SHELL_VOCABULARY.split()
    return texts + [" ".join(words), "\n".join(words)] * 40


def agent_framing() -> list[str]:
    """What the model agent says around the task in the tiny presets' text format: the trainer's
    system prompt, the working directory line, an observation's exit code."""
    from termgym.agents.prompts import observation, task_prompt

    from .rollout import SHORT_TEXT_SYSTEM

    return [SHORT_TEXT_SYSTEM, task_prompt("", "/app"), observation("", 0, False, max_chars=10)]


def train_tokenizer(texts: list[str], vocab_size: int = 1024, family: str = TINY_FAMILY) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on ``texts``, with the special tokens of the chat format ``family``
    as single ids (the pad token is id 0) and the project's chat template for it."""
    return train_family_tokenizer(texts, family, vocab_size)


def tiny_config(
    vocab_size: int,
    *,
    hidden: int = 64,
    layers: int = 2,
    experts: int = 4,
    context: int = 2048,
    head_dim: int | None = None,
) -> Qwen3MoeConfig:
    """A Qwen3-MoE configuration of a few hundred thousand parameters: every layer sparse, top-2
    of ``experts`` experts, tied embeddings, no router auxiliary loss. ``head_dim`` defaults to
    ``hidden // 4`` (vLLM's CPU attention needs at least 64)."""
    return Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        moe_intermediate_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim or hidden // 4,  # pyright: ignore[reportCallIssue]  # @strict config: head_dim via **kwargs
        num_experts=experts,
        num_experts_per_tok=2,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=context,
        tie_word_embeddings=True,
        router_aux_loss_coef=0.0,
        output_router_logits=False,
        pad_token_id=0,
        eos_token_id=2,
        bos_token_id=1,
    )


def tiny_tokenizer(envs_root: Path | None = None, vocab_size: int = 1024) -> PreTrainedTokenizerFast:
    """The tiny policy's tokenizer: trained on the bundled tasks' text (``corpus_texts``), in the
    ``TINY_FAMILY`` chat format; the same for every seed."""
    if envs_root is None:
        from termgym.tasks.bundled import bundled_root

        envs_root = Path(bundled_root())
    return train_tokenizer(corpus_texts(envs_root) + agent_framing() * 40, vocab_size)  # the framing in few tokens


def build_tiny_policy(
    out_dir: str | os.PathLike,
    envs_root: Path | None = None,
    *,
    seed: int = 0,
    vocab_size: int = 1024,
    hidden: int = 64,
    layers: int = 2,
    experts: int = 4,
    head_dim: int | None = None,
) -> Path:
    """Train the tokenizer, build a randomly initialised tiny Qwen3-MoE policy (``seed``), and save
    both to ``out_dir`` as a normal model directory. Returns ``out_dir``. ``head_dim`` as in
    ``tiny_config`` (64 for a policy vLLM serves on CPU)."""
    tokenizer = tiny_tokenizer(envs_root, vocab_size)
    torch.manual_seed(seed)
    model = Qwen3MoeForCausalLM(
        tiny_config(len(tokenizer), hidden=hidden, layers=layers, experts=experts, head_dim=head_dim)
    )
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def load_policy(model_dir: str | os.PathLike) -> tuple[PreTrainedModel, PreTrainedTokenizerFast]:
    """A causal LM and its tokenizer from a local directory, in float32 and eval mode. A tokenizer
    without a pad token pads with its eos token (padding is masked out everywhere)."""
    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot load the policy {model_dir}: {' '.join(str(exc).split())[:300]}") from None
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token is None:
            raise ConfigError(f"{model_dir}: the tokenizer has neither a pad nor an eos token")
        tokenizer.pad_token = tokenizer.eos_token
    return model.eval(), tokenizer


# config.json keys that state a model's context window, by how common they are (Llama, Qwen, Mistral
# and most others; GPT-2; BLOOM-like; ChatGLM; MPT), in the config or in its text model's
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "max_seq_len")


def context_window(model_dir: str | os.PathLike) -> int | None:
    """The context window ``model_dir``'s ``config.json`` states: the first of ``CONTEXT_KEYS``
    with a positive integer, at the top level or in ``text_config`` (a multimodal wrapper's text
    model); None when the file is missing or unreadable or states none."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") if isinstance(config, dict) else None):
        if not isinstance(section, dict):
            continue
        for key in CONTEXT_KEYS:
            value = section.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
    return None


def policy_renderer(model_dir: str | os.PathLike, tokenizer, cfg) -> Renderer:
    """The renderer ``cfg.renderer`` names for the policy in ``model_dir`` (auto: from its files)."""
    return renderer_for_model_dir(model_dir, cfg.renderer, thinking=cfg.thinking, tokenizer=tokenizer)


class Critic(nn.Module):
    """The policy's architecture without its LM head, plus a scalar value head: ``forward(ids,
    mask)`` gives one value per position (the value of the state after reading that token).
    Initialised from the policy's weights; the value head starts at zero."""

    def __init__(self, policy_dir: str | os.PathLike) -> None:
        super().__init__()
        causal = AutoModelForCausalLM.from_pretrained(policy_dir, local_files_only=True, dtype=torch.float32)
        self.backbone = causal.model  # the decoder stack, the same weights the policy starts from
        self.value_head = nn.Linear(causal.config.hidden_size, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return self.value_head(hidden).squeeze(-1).clone()  # not a view: FSDP hooks the output
