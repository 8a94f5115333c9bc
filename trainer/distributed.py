"""Several trainer processes (``torchrun --nproc-per-node N``, gloo on CPU): this process's rank,
FSDP2 sharding, the gradient sum of unsharded models, and the process group's lifetime."""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.fsdp import FSDPModule, fully_shard

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0 only when sharded


def world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)


def shard(model: torch.nn.Module, layers: Sequence[torch.nn.Module]) -> None:
    """FSDP2: each decoder layer, then the rest, sharded over the ranks. Gradients are then
    reduce-scattered (averaged) by FSDP itself."""
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)


def sync_gradients(model: torch.nn.Module) -> None:
    """Sum gradients over ranks (each rank's loss is already scaled to its share of the total).
    A parameter without a gradient here (an expert no local token was routed to) contributes
    zeros, so every rank makes the same collective calls. FSDP models reduce their own."""
    if dist.is_initialized() and not isinstance(model, FSDPModule):
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)


@contextmanager
def process_group() -> Iterator[None]:
    """Join the process group when started by torchrun (``RANK`` set); on a clean exit wait for
    every rank before tearing it down (not on failure: that would hang), and always tear it down."""
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")
    try:
        yield
        if dist.is_initialized():
            dist.barrier()  # no rank tears the group down while another still uses it
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
