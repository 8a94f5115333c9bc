"""``write-file`` (1 turn): create /app/NAME.txt holding WORD → ``echo WORD > /app/NAME.txt``."""

from __future__ import annotations

import random

from .names import NamePool
from .spec import TaskSpec, holds_exactly, is_file, mentions, only

FAMILY = "write-file"


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Four assertions, none passed by doing nothing."""
    name, word = names.draw(rng, 2)
    path = f"/app/{name}.txt"
    return TaskSpec(
        name=f"{FAMILY}-{name}",
        family=FAMILY,
        instruction=f"Create the file {path} containing the word {word}.",
        commands=(f"echo {word} > {path}",),
        assertions=(
            (f"{path} exists", is_file(path)),
            (f"{path} contains the word {word}", mentions(path, word)),
            (f"{path} holds exactly {word}", holds_exactly(path, word)),
            (f"only {path} in /app", only((path,))),
        ),
        params=(name, word),
    )
