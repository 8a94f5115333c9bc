"""``nested-tree`` (5 turns): ``mkdir /app/DIR``, ``mkdir /app/DIR/SUB``, a file in each, then a
copy of the first file into the subdirectory."""

from __future__ import annotations

import random

from ..names import NamePool
from ..spec import TaskSpec, is_dir, only
from .common import file_holds

FAMILY = "nested-tree"


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Nine assertions; each command passes at least one more."""
    directory, sub, first, second, copy, word1, word2 = names.draw(rng, 7)
    top, inner = f"/app/{directory}", f"/app/{directory}/{sub}"
    a, b, c = f"{top}/{first}.txt", f"{inner}/{second}.txt", f"{inner}/{copy}.txt"
    return TaskSpec(
        name=f"{FAMILY}-{directory}",
        family=FAMILY,
        instruction=(
            f"Create the directory {top} and inside it the directory {inner}, then create {a}"
            f" containing the word {word1} and {b} containing the word {word2}, then copy {a} to {c}."
        ),
        commands=(f"mkdir {top}", f"mkdir {inner}", f"echo {word1} > {a}", f"echo {word2} > {b}", f"cp {a} {c}"),
        assertions=(
            (f"{top} is a directory", is_dir(top)),
            (f"{inner} is a directory", is_dir(inner)),
            *file_holds(a, word1),
            *file_holds(b, word2),
            *file_holds(c, word1),
            (f"only {top}, {inner} and the three files in /app", only((top, inner, a, b, c))),
        ),
        params=(directory, sub, first, second, copy, word1, word2),
    )
