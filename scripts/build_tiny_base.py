"""Build the tiny base policy that ``--init bundled`` starts from (``trainer/tiny_base/``).

A pretrained model is where the published recipe starts; the tiny policy has none, so this script
makes one the same way every time: the tiny preset's architecture and tokenizer (seed 0), trained
with the supervised loss on the reference solutions of the ``short`` families' training pool
(1200 tasks, seed 0: training names only, never a held-out name, and no family of the ``explore``
set's teacher). What it learns there is the format and copying names from an instruction, which
the tiny policy otherwise learns late and on some seeds not at all within the main job's budget.

    .venv/bin/python scripts/build_tiny_base.py [--steps 750] [--out trainer/tiny_base]

It takes about 6 minutes on a 2-core machine and is deterministic on CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from termgym.trainer.config import PRESETS, Config, resolve_max_context  # noqa: E402
from termgym.trainer.demonstrations import record_demonstrations  # noqa: E402
from termgym.trainer.models import policy_renderer  # noqa: E402
from termgym.trainer.pipeline import build_policy, prepare_pool, warm_start  # noqa: E402

BASE_SETTINGS = dict(families="short", demonstrations="reference", ppo_pool=0, init="", heldout=0, seed=0)


async def build(out: Path, steps: int) -> None:
    console = Console(file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="tiny-base-") as scratch:
        run = Path(scratch)
        cfg = resolve_max_context(replace(Config(), **{**PRESETS["tiny"], **BASE_SETTINGS, "sft_steps": steps}), None)
        pool = await prepare_pool(run, cfg, console)
        policy, tokenizer = build_policy(run, cfg, console)
        renderer = policy_renderer(run / "init", tokenizer, cfg)
        demos = await record_demonstrations(run, cfg, pool.selection, renderer, console)
        await warm_start(run, cfg, demos, policy, tokenizer, console)
        shutil.rmtree(out, ignore_errors=True)
        shutil.copytree(run / "sft" / "policy", out)
    console.print(f"the tiny base: {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=750, help="supervised steps (default 750)")
    parser.add_argument("--out", type=Path, default=ROOT / "trainer" / "tiny_base")
    args = parser.parse_args()
    asyncio.run(build(args.out, args.steps))


if __name__ == "__main__":
    main()
