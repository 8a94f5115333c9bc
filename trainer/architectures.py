"""Tiny, randomly initialised policies of real model architectures, built from configurations alone.

``ARCHITECTURES`` names the architectures ``termgym train --model DIR`` is tested on: ``qwen3``
(dense ``Qwen3ForCausalLM``), ``qwen3-moe`` (``Qwen3MoeForCausalLM``, every layer sparse),
``qwen3.5-moe`` (the text-only ``Qwen3_5MoeForCausalLM``: Gated DeltaNet linear-attention and
gated full-attention layers, every layer sparse) and ``llama`` (``LlamaForCausalLM``, Llama 3 style).

Guarantees: ``tiny_architecture_config`` returns the architecture's own ``transformers``
configuration class, of a few hundred thousand parameters at the default size, with 4 query and 2
key/value heads, tied input and output embeddings, the given special-token ids, and for the MoE
architectures every layer sparse, top-2 of ``experts``, the router's auxiliary loss off.
``build_architecture_policy`` writes an ordinary Hugging Face model directory that
``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` load offline; the
same ``seed`` gives the same weights. Nothing here touches the network. Not guaranteed: that a
tiny policy does anything useful.

Each architecture's shape, and what is tested on each: docs/guides/training.md#models."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before transformers reads it

from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)
from transformers.models.qwen3_5_moe import Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig

from termgym.errors import UnknownName

ARCHITECTURES = ("qwen3", "qwen3-moe", "qwen3.5-moe", "llama")

# the causal-LM class and the config.json ``model_type`` of each architecture
ARCHITECTURE_CLASSES: dict[str, type[PreTrainedModel]] = {
    "qwen3": Qwen3ForCausalLM,
    "qwen3-moe": Qwen3MoeForCausalLM,
    "qwen3.5-moe": Qwen3_5MoeForCausalLM,
    "llama": LlamaForCausalLM,
}
ARCHITECTURE_MODEL_TYPES = {
    "qwen3": "qwen3",
    "qwen3-moe": "qwen3_moe",
    "qwen3.5-moe": "qwen3_5_moe_text",
    "llama": "llama",
}
MOE_ARCHITECTURES = frozenset({"qwen3-moe", "qwen3.5-moe"})

HEADS, KV_HEADS, TOP_K = 4, 2, 2
QWEN3_ROPE_THETA, QWEN3_5_ROPE_THETA, LLAMA3_ROPE_THETA = 1_000_000.0, 10_000_000.0, 500_000.0
QWEN3_5_FULL_ATTENTION_INTERVAL = 4  # Qwen3.5: three linear-attention layers, then one full


def _check_architecture(architecture: str) -> None:
    if architecture not in ARCHITECTURES:
        raise UnknownName("unknown model architecture", architecture, ARCHITECTURES)


def qwen3_5_layer_types(layers: int) -> list[str]:
    """Qwen3.5's hybrid pattern for ``layers`` layers: every fourth layer full attention, the rest
    linear attention; with fewer than four layers the last one is the full-attention layer."""
    interval = min(QWEN3_5_FULL_ATTENTION_INTERVAL, layers)
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]


def _mrope_section(rotary_dim: int) -> list[int]:
    """Qwen3.5's multimodal rotary split of the ``rotary_dim // 2`` frequencies into temporal,
    height and width sections (``[11, 11, 10]`` for the real 64): text positions are the same in
    all three, so only the sum matters, and it must be the frequency count."""
    half = rotary_dim // 2
    return [(half + 2) // 3, (half + 1) // 3, half // 3]


def tiny_architecture_config(
    architecture: str,
    vocab_size: int,
    *,
    hidden: int = 64,
    layers: int = 2,
    experts: int = 4,
    context: int = 2048,
    head_dim: int | None = None,
    pad_id: int | None,
    eos_id: int | None,
    bos_id: int | None,
) -> PretrainedConfig:
    """The ``transformers`` configuration of a tiny ``architecture`` model (module docstring):
    ``hidden`` wide, ``layers`` deep, ``experts`` experts per MoE layer, ``context`` positions.
    ``head_dim`` (every attention head, Qwen3.5's linear-attention heads included) defaults to
    ``hidden // 4`` (vLLM's CPU attention needs at least 64)."""
    _check_architecture(architecture)
    head = head_dim or hidden // HEADS
    common: dict[str, Any] = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        head_dim=head,
        max_position_embeddings=context,
        tie_word_embeddings=True,
        pad_token_id=pad_id,
        eos_token_id=eos_id,
        bos_token_id=bos_id,
    )
    moe: dict[str, Any] = dict(
        num_experts=experts,
        num_experts_per_tok=TOP_K,
        moe_intermediate_size=hidden,
        router_aux_loss_coef=0.0,
        output_router_logits=False,
    )
    if architecture == "qwen3":
        return Qwen3Config(
            **common,
            intermediate_size=3 * hidden,  # Qwen3-0.6B's ratio (1024 -> 3072)
            rope_parameters={"rope_type": "default", "rope_theta": QWEN3_ROPE_THETA},
            use_sliding_window=False,
        )
    if architecture == "qwen3-moe":
        return Qwen3MoeConfig(
            **common,
            **moe,
            intermediate_size=2 * hidden,  # read only by dense layers: there are none
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            rope_parameters={"rope_type": "default", "rope_theta": QWEN3_ROPE_THETA},
            use_sliding_window=False,
        )
    if architecture == "qwen3.5-moe":
        partial = 0.25
        return Qwen3_5MoeTextConfig(
            **common,
            **moe,
            shared_expert_intermediate_size=hidden,
            layer_types=qwen3_5_layer_types(layers),
            linear_conv_kernel_dim=4,
            linear_num_key_heads=KV_HEADS,
            linear_num_value_heads=HEADS,
            linear_key_head_dim=head,
            linear_value_head_dim=head,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": QWEN3_5_ROPE_THETA,
                "partial_rotary_factor": partial,
                "mrope_section": _mrope_section(int(head * partial)),
                "mrope_interleaved": True,
            },
        )
    return LlamaConfig(
        **common,
        intermediate_size=4 * hidden,  # Llama-3.2-1B's ratio (2048 -> 8192), the tied-embedding Llama 3
        rope_parameters={"rope_type": "default", "rope_theta": LLAMA3_ROPE_THETA},
        rms_norm_eps=1e-5,
        attention_bias=False,
        mlp_bias=False,
    )


def build_architecture_model(config: PretrainedConfig, architecture: str, *, seed: int = 0) -> PreTrainedModel:
    """A randomly initialised ``architecture`` model of ``config`` (the same ``seed``, the same
    weights), in float32."""
    _check_architecture(architecture)
    torch.manual_seed(seed)
    return ARCHITECTURE_CLASSES[architecture](config).float()


def build_architecture_policy(
    out_dir: str | os.PathLike,
    architecture: str,
    tokenizer: PreTrainedTokenizerBase,
    *,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    experts: int = 4,
    context: int = 2048,
    head_dim: int | None = None,
) -> Path:
    """Build a tiny random ``architecture`` policy over ``tokenizer``'s vocabulary (its pad, eos and
    bos ids in the config) and save model and tokenizer to ``out_dir`` as a normal model directory.
    Returns ``out_dir``."""
    _check_architecture(architecture)
    config = tiny_architecture_config(
        architecture,
        len(tokenizer),
        hidden=hidden,
        layers=layers,
        experts=experts,
        context=context,
        head_dim=head_dim,
        pad_id=_token_id(tokenizer.pad_token_id),
        eos_id=_token_id(tokenizer.eos_token_id),
        bos_id=_token_id(tokenizer.bos_token_id),
    )
    model = build_architecture_model(config, architecture, seed=seed)
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _token_id(value: object) -> int | None:
    """A tokenizer's special-token id as a plain int (None when the tokenizer has no such token)."""
    return value if isinstance(value, int) else None


def parameter_count(model: torch.nn.Module) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())
