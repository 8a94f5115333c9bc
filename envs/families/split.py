"""Write a split (the training pool or the held-out set) as task directories.

Guarantees of ``generate_split(out_dir, split, count, seed, first=0, family_set="short")``:

- deterministic in ``(split, seed)``: task ``i`` is drawn from its own ``random.Random`` seeded by
  ``(split, seed, i)``, so the first ``n`` tasks of a larger split are the tasks of a split of
  ``n``, and ``first=n`` continues a split of ``n`` with tasks it does not hold (a validation set
  in the training name space, disjoint from a pool of ``n``);
- families are balanced (round-robin over the split's families, in a fixed order);
- ``family_set`` picks the families (``FAMILY_SETS``: ``short``, one to three turns and 3 to 6
  assertions a task; ``long``, four to eight turns and 8 to 20 assertions; ``explore``, the main
  job's; ``parts``, three to five independent parts with an assertion each);
  ``train`` uses the set's training families; ``heldout`` uses every family of the set, including
  its held-out-only one, which never appears in training;
- every name and word comes from the split's own part of the name space, so no held-out
  parameter occurs in any training task, whatever the two seeds;
- ``out_dir/split.json`` lists the tasks with their families, the split, the seed, the family set
  and its families.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

from termgym.errors import ConfigError, UnknownName

from . import copy_file, dir_and_file, dir_file_copy, make_dir, parts, two_files, write_file
from .explore import find_file, flawed, make_path, read_config
from .long import copy_chain, dir_files, file_set, nested_tree, two_dirs
from .names import MAX_LENGTH, SPLITS, NamePool
from .spec import TaskSpec
from .writer import write_task

MAX_COUNT = 100_000


@dataclass(frozen=True)
class Family:
    """A family's name and its pure generator."""

    name: str
    make: Callable[[random.Random, NamePool], TaskSpec]

    @classmethod
    def of(cls, module: ModuleType) -> Family:
        """A family module's (its ``FAMILY`` and ``make``)."""
        return cls(module.FAMILY, module.make)


@dataclass(frozen=True)
class FamilySet:
    """Families drawn together, round-robin in ``members``' order; ``heldout_only`` never trains;
    every task of the set has ``assertions[0]`` to ``assertions[1]`` assertions."""

    name: str
    members: tuple[Family, ...]
    heldout_only: tuple[str, ...]
    assertions: tuple[int, int]
    longest_name: int = MAX_LENGTH  # letters in the longest name or word a task of the set draws

    @property
    def families(self) -> dict[str, Family]:
        return {f.name: f for f in self.members}

    @property
    def train_families(self) -> tuple[str, ...]:
        return tuple(f for f in self.families if f not in self.heldout_only)

    def split_families(self, split: str) -> tuple[str, ...]:
        if split not in SPLITS:
            raise UnknownName("unknown split", split, SPLITS)
        return self.train_families if split == "train" else tuple(self.families)

    def seed_text(self, split: str, seed: int, index: int) -> str:
        """What task ``index``'s generator is seeded with (the short set's predates the sets)."""
        scope = "termgym.envs.families" if self.name == "short" else f"termgym.envs.families/{self.name}"
        return f"{scope}/{split}/{seed}/{index}"


def _of(*modules: ModuleType) -> tuple[Family, ...]:
    return tuple(Family.of(m) for m in modules)


FAMILY_SETS: dict[str, FamilySet] = {
    # Shortest first, so that stragglers are visible.
    "short": FamilySet(
        "short",
        _of(write_file, make_dir, copy_file, dir_and_file, dir_file_copy, two_files),
        (two_files.FAMILY,),
        (3, 6),
    ),
    "long": FamilySet("long", _of(file_set, dir_files, nested_tree, copy_chain, two_dirs), (two_dirs.FAMILY,), (8, 20)),
    # The main job's: each family with the scripted teacher's systematic mistake (explore/__init__).
    "explore": FamilySet(
        "explore",
        (
            Family(write_file.FAMILY, flawed.write_file_with_flaw),
            *_of(make_path),
            Family(copy_file.FAMILY, flawed.copy_file_with_flaw),
            Family(dir_and_file.FAMILY, flawed.dir_and_file_with_flaw),
            *_of(read_config, find_file),
            Family(two_files.FAMILY, flawed.two_files_with_flaw),
        ),
        (two_files.FAMILY,),
        (3, 6),
        # names of 3 to 5 letters: the main job's budget goes to what reward teaches, not to copying
        longest_name=5,
    ),
    # Several independent parts, one assertion each (envs/families/parts.py): where a dense reward and
    # a binary one can differ (bench/dense_binary.py). No family is held out: the held-out set's names are.
    "parts": FamilySet(
        "parts", tuple(Family(name, make) for name, make in parts.FAMILIES.items()), (), (3, 5), longest_name=5
    ),
}
FAMILIES: dict[str, Family] = FAMILY_SETS["short"].families
HELDOUT_ONLY: tuple[str, ...] = FAMILY_SETS["short"].heldout_only
TRAIN_FAMILIES: tuple[str, ...] = FAMILY_SETS["short"].train_families


def family_set_named(name: str) -> FamilySet:
    if name not in FAMILY_SETS:
        raise UnknownName("unknown family set", name, FAMILY_SETS)
    return FAMILY_SETS[name]


def make_task(split: str, seed: int, index: int, family_set: str = "short") -> TaskSpec:
    """Task ``index`` of the split drawn with ``seed`` from the family set (pure: no I/O)."""
    chosen = family_set_named(family_set)
    families = chosen.split_families(split)
    family = families[index % len(families)]
    names = NamePool(split, chosen.longest_name)
    spec = chosen.families[family].make(random.Random(chosen.seed_text(split, seed, index)), names)
    low, high = chosen.assertions
    if not low <= len(spec.assertions) <= high:
        raise ValueError(f"{spec.name}: {len(spec.assertions)} assertions, the {chosen.name} set needs {low} to {high}")
    return replace(spec, name=f"{family}-{index:04d}")


def generate_split(
    out_dir: str | os.PathLike[str], split: str, count: int, seed: int, first: int = 0, family_set: str = "short"
) -> list[Path]:
    """Write tasks ``first`` to ``first + count - 1`` as ``out_dir/<family>-<index>`` and
    ``out_dir/split.json``; returns the task directories in index order. ``out_dir`` may exist but
    must hold no task of the same name."""
    chosen = family_set_named(family_set)
    families = chosen.split_families(split)
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
        raise ConfigError(f"count must be an integer from 1 to {MAX_COUNT}, got {count!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed must be an integer, got {seed!r}")
    if isinstance(first, bool) or not isinstance(first, int) or not 0 <= first <= MAX_COUNT - count:
        raise ConfigError(f"first must be an integer from 0 to {MAX_COUNT - count}, got {first!r}")
    root = Path(out_dir)
    indices = range(first, first + count)
    specs = [make_task(split, seed, i, chosen.name) for i in indices]
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
        "family_set": chosen.name,
        "families": list(families),
        "heldout_only": list(chosen.heldout_only),
        "tasks": [{"dir": s.name, "family": s.family, "turns": len(s.commands)} for s in specs],
    }
    (root / "split.json").write_text(json.dumps(listing, indent=2) + "\n")
    return paths
