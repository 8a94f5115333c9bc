"""Checkpoints: ``checkpoint.pt`` (actor, critic, both optimizers, the step and the task pool's
draws; whole tensors keyed by parameter name, the same format sharded or not) and ``policy/`` (a
normal model directory). A resumed run continues bit-for-bit on CPU."""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from .config import Config
from .distributed import FULL, world


def save_checkpoint(
    out: Path, step: int, drawn: int, policy, critic, actor_opt, critic_opt, skeleton, tokenizer, cfg: Config
) -> None:
    """``checkpoint.pt`` (replaced atomically; whole tensors keyed by parameter name, the same
    format sharded or not) and ``policy/`` (a normal model directory, written from ``skeleton``,
    an unsharded copy of the policy). Every rank must call it; rank 0 writes."""
    state = {
        "step": step,
        "drawn": drawn,
        "config": asdict(cfg),
        "policy": get_model_state_dict(policy, options=FULL),
        "critic": get_model_state_dict(critic, options=FULL),
        "actor_opt": get_optimizer_state_dict(policy, actor_opt, options=FULL),
        "critic_opt": get_optimizer_state_dict(critic, critic_opt, options=FULL),
    }
    if world()[0] != 0:
        return
    torch.save(state, out / "checkpoint.pt.tmp")
    os.replace(out / "checkpoint.pt.tmp", out / "checkpoint.pt")
    skeleton.save_pretrained(out / "policy", state_dict=state["policy"])
    tokenizer.save_pretrained(out / "policy")


def load_checkpoint(out: Path) -> dict | None:
    """The state ``save_checkpoint`` wrote into ``out``, or None when there is none."""
    path = out / "checkpoint.pt"
    return torch.load(path, weights_only=False) if path.exists() else None


def restore_optimizers(state: dict, policy, critic, actor_opt, critic_opt) -> None:
    """Load both optimizers' state from a checkpoint (after any sharding: whole tensors go in)."""
    loading = StateDictOptions(full_state_dict=True)
    set_optimizer_state_dict(policy, actor_opt, state["actor_opt"], options=loading)
    set_optimizer_state_dict(critic, critic_opt, state["critic_opt"], options=loading)
