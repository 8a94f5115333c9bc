"""The short set's families with the teacher's mistake each one is given in the explore set."""

from __future__ import annotations

import random
from dataclasses import replace

from .. import copy_file, dir_and_file, two_files, write_file
from ..names import NamePool
from ..spec import Flaw, TaskSpec

FORGETS_CONTENT, MOVES, STOPS_EARLY = 0.3, 0.6, 0.6


def write_file_with_flaw(rng: random.Random, names: NamePool) -> TaskSpec:
    spec = write_file.make(rng, names)
    name, _ = spec.params
    return replace(
        spec, flaws=(Flaw("touched the file and forgot its content", FORGETS_CONTENT, (f"touch /app/{name}.txt",)),)
    )


def copy_file_with_flaw(rng: random.Random, names: NamePool) -> TaskSpec:
    spec = copy_file.make(rng, names)
    source, dest, _ = spec.params
    return replace(spec, flaws=(Flaw("moved instead of copying", MOVES, (f"mv /app/{source}.txt /app/{dest}.txt",)),))


def dir_and_file_with_flaw(rng: random.Random, names: NamePool) -> TaskSpec:
    spec = dir_and_file.make(rng, names)
    return replace(spec, flaws=(Flaw("stopped after the directory", STOPS_EARLY, spec.commands[:1]),))


def two_files_with_flaw(rng: random.Random, names: NamePool) -> TaskSpec:
    spec = two_files.make(rng, names)
    return replace(spec, flaws=(Flaw("stopped after the first file", STOPS_EARLY, spec.commands[:1]),))
