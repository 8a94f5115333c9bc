"""``two-dirs`` (5 turns, held out: never in training): two directories, a file in the first, its
copy and a second file in the other. Its template is unseen in training; its commands are not."""

from __future__ import annotations

import random

from ..names import NamePool
from ..spec import TaskSpec, is_dir, only
from .common import file_holds

FAMILY = "two-dirs"


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Nine assertions; each command passes at least one more."""
    left, right, name, other, word1, word2 = names.draw(rng, 6)
    d1, d2 = f"/app/{left}", f"/app/{right}"
    a, copy, b = f"{d1}/{name}.txt", f"{d2}/{name}.txt", f"{d2}/{other}.txt"
    return TaskSpec(
        name=f"{FAMILY}-{left}",
        family=FAMILY,
        instruction=(
            f"Create the directories {d1} and {d2}, then create {a} containing the word {word1},"
            f" copy it to {copy}, and create {b} containing the word {word2}."
        ),
        commands=(f"mkdir {d1}", f"mkdir {d2}", f"echo {word1} > {a}", f"cp {a} {copy}", f"echo {word2} > {b}"),
        assertions=(
            (f"{d1} is a directory", is_dir(d1)),
            (f"{d2} is a directory", is_dir(d2)),
            *file_holds(a, word1),
            *file_holds(copy, word1),
            *file_holds(b, word2),
            (f"only {d1}, {d2} and the three files in /app", only((d1, d2, a, copy, b))),
        ),
        params=(left, right, name, other, word1, word2),
    )
