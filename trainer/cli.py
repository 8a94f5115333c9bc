"""The trainer's command line: ``termgym train ...`` (the ``train`` entry of the ``termgym.commands``
entry points), ``python -m termgym.trainer ...`` and ``torchrun ... -m termgym.trainer ...``.

Without ``--pool`` it runs PPO alone (``trainer/ppo.py``), under torchrun on every rank; with
``--pool N`` the whole main job (``trainer/pipeline.py``) in one process. Either way the backends'
shared clients and any vLLM engine are closed on every path out.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from termgym.errors import ConfigError
from termgym.sandboxes import close_backends

from .checks import check_config
from .config import Config
from .distributed import process_group
from .flags import parse_config
from .pipeline import run_pipeline
from .ppo import train
from .vllm_sampler import close_engines


async def _closing(job):
    try:
        return await job
    finally:
        await close_backends()  # the backends' shared clients (HTTP sessions)
        close_engines()  # a vLLM sampler's processes, on every path


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (the flags after ``termgym train``) and run it; 0 when it finished."""
    cfg = parse_config(argv)
    check_config(cfg)
    if not cfg.out:
        cfg = replace(
            cfg, out=time.strftime(f"runs/{'pipeline' if cfg.pool else 'train'}-%Y%m%d-%H%M%S", time.gmtime())
        )
    torch.manual_seed(cfg.seed)
    if cfg.pool:
        if "RANK" in os.environ:
            raise ConfigError("--pool runs the whole pipeline in one process; run its PPO phase alone under torchrun")
        asyncio.run(_closing(run_pipeline(cfg)))
        return 0
    run_ppo(cfg)
    return 0


def run_ppo(cfg: Config) -> list[dict]:
    """PPO alone, on this process's rank of torchrun's group if there is one; every step's metrics."""
    with process_group():
        return asyncio.run(_closing(train(cfg)))
