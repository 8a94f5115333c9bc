"""Parametric task families for the training pool and the held-out set (issue 8).

Each family is a module with a pure generator ``make(rng, names) -> TaskSpec``: one instruction
template, a reference solution whose every command is copied from the instruction by a fixed
pattern, and shell assertions that give partial credit step by step. Two family sets
(``FAMILY_SETS``): ``short`` (the main job's: 1 to 3 turns, 3 to 6 assertions) and ``long``
(``termgym.envs.families.long``: 4 to 8 turns, 8 to 20 assertions). Names and words are
drawn fresh for every task from a name space partitioned by hash between the splits
(``names.split_of``), so held-out parameters never occur in training, whatever the seeds.

``generate_split`` writes a split as task directories; ``reference_commands`` reads a task's
reference commands back. This package holds no task directory itself.
"""

from __future__ import annotations

from pathlib import Path

from . import copy_file, dir_and_file, dir_file_copy, make_dir, two_files, write_file
from .names import NamePool, split_of
from .spec import TaskSpec
from .split import (
    FAMILIES,
    FAMILY_SETS,
    HELDOUT_ONLY,
    TRAIN_FAMILIES,
    FamilySet,
    family_set_named,
    generate_split,
    make_task,
)
from .writer import reference_commands, write_task


def bundled_audit_cache() -> Path:
    """Verdicts of ``termgym audit --k 1`` on the pools of the presets that draw one (``--preset
    tiny``, the explore set, seeds 0, 1 and 2; ``--preset tiny-long``, the long set and its first
    stage's short set, seed 0), keyed by task content.
    Regenerate it after changing a family (a test fails until then)::

        python -m termgym.envs.families /tmp/pool --split train --count POOL --seed 0 [--families explore]
        termgym audit /tmp/pool --k 1 -n 6 --cache envs/families/audit-cache.json
    """
    return Path(__file__).resolve().parent / "audit-cache.json"


__all__ = [
    "FAMILIES",
    "FAMILY_SETS",
    "HELDOUT_ONLY",
    "TRAIN_FAMILIES",
    "FamilySet",
    "NamePool",
    "TaskSpec",
    "bundled_audit_cache",
    "copy_file",
    "dir_and_file",
    "dir_file_copy",
    "family_set_named",
    "generate_split",
    "make_dir",
    "make_task",
    "reference_commands",
    "split_of",
    "two_files",
    "write_file",
    "write_task",
]
