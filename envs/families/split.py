"""Write a split (the training pool or the held-out set) as task directories.

Guarantees of ``generate_split(out_dir, split, count, seed, first=0)``:

- deterministic in ``(split, seed)``: task ``i`` is drawn from its own ``random.Random`` seeded by
  ``(split, seed, i)``, so the first ``n`` tasks of a larger split are the tasks of a split of
  ``n``, and ``first=n`` continues a split of ``n`` with tasks it does not hold (a validation set
  in the training name space, disjoint from a pool of ``n``);
- families are balanced (round-robin over the split's families, in a fixed order);
- ``train`` uses ``TRAIN_FAMILIES``; ``heldout`` uses every family, including ``HELDOUT_ONLY``,
  which never appears in training;
- every name and word comes from the split's own part of the name space, so no held-out
  parameter occurs in any training task, whatever the two seeds;
- ``out_dir/split.json`` lists the tasks with their families, the split, the seed and the families.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import replace
from pathlib import Path
from types import ModuleType

from termgym.envs.families import copy_file, dir_and_file, dir_file_copy, make_dir, two_files, write_file
from termgym.envs.families.names import SPLITS, NamePool
from termgym.envs.families.spec import TaskSpec
from termgym.envs.families.writer import write_task
from termgym.errors import ConfigError

# Shortest first: one-command tasks up to the three-command one, so that stragglers are visible.
_MODULES: tuple[ModuleType, ...] = (write_file, make_dir, copy_file, dir_and_file, dir_file_copy, two_files)
FAMILIES: dict[str, ModuleType] = {m.FAMILY: m for m in _MODULES}
HELDOUT_ONLY: tuple[str, ...] = (two_files.FAMILY,)
TRAIN_FAMILIES: tuple[str, ...] = tuple(f for f in FAMILIES if f not in HELDOUT_ONLY)
MAX_COUNT = 100_000


def split_families(split: str) -> tuple[str, ...]:
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; choose one of: {', '.join(SPLITS)}")
    return TRAIN_FAMILIES if split == "train" else tuple(FAMILIES)


def make_task(split: str, seed: int, index: int) -> TaskSpec:
    """Task ``index`` of the split drawn with ``seed`` (pure: no I/O)."""
    families = split_families(split)
    family = families[index % len(families)]
    rng = random.Random(f"termgym.envs.families/{split}/{seed}/{index}")
    spec = FAMILIES[family].make(rng, NamePool(split))
    return replace(spec, name=f"{family}-{index:04d}")


def generate_split(out_dir: str | os.PathLike[str], split: str, count: int, seed: int, first: int = 0) -> list[Path]:
    """Write tasks ``first`` to ``first + count - 1`` as ``out_dir/<family>-<index>`` and
    ``out_dir/split.json``; returns the task directories in index order. ``out_dir`` may exist but
    must hold no task of the same name."""
    families = split_families(split)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise ConfigError(f"count must be an integer from 1 to {MAX_COUNT}, got {count!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    if isinstance(first, bool) or not isinstance(first, int) or not 0 <= first <= MAX_COUNT - count:
        raise ConfigError(f"first must be an integer from 0 to {MAX_COUNT - count}, got {first!r}")
    root = Path(out_dir)
    indices = range(first, first + count)
    specs = [make_task(split, seed, i) for i in indices]
    clashes = [s.name for s in specs if (root / s.name).exists()]
    if clashes:
        raise ConfigError(f"{root / clashes[0]} already exists ({len(clashes)} task directories would be overwritten)")
    root.mkdir(parents=True, exist_ok=True)
    paths = [write_task(s, root / s.name, split=split, seed=seed, index=i) for i, s in zip(indices, specs)]
    listing = {
        "split": split,
        "seed": seed,
        "count": count,
        "first": first,
        "families": list(families),
        "heldout_only": list(HELDOUT_ONLY),
        "tasks": [{"dir": s.name, "family": s.family, "turns": len(s.commands)} for s in specs],
    }
    (root / "split.json").write_text(json.dumps(listing, indent=2) + "\n")
    return paths
