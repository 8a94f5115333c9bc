"""``dir-file-copy`` (3 turns): ``mkdir /app/DIR``, ``echo WORD > /app/DIR/NAME.txt``, then
``cp /app/DIR/NAME.txt /app/DIR/OTHER.txt``."""

from __future__ import annotations

import random

from .names import NamePool
from .spec import TaskSpec, holds_exactly, is_dir, is_file, only

FAMILY = "dir-file-copy"


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Six assertions; doing nothing passes none; each command of the reference solution passes
    more (1, 3, then 6)."""
    directory, name, other, word = names.draw(rng, 4)
    folder = f"/app/{directory}"
    path, copy = f"{folder}/{name}.txt", f"{folder}/{other}.txt"
    return TaskSpec(
        name=f"{FAMILY}-{directory}",
        family=FAMILY,
        instruction=(
            f"Create the directory {folder}, then create the file {path} containing the word {word},"
            f" then copy it to {copy}."
        ),
        commands=(f"mkdir {folder}", f"echo {word} > {path}", f"cp {path} {copy}"),
        assertions=(
            (f"{folder} is a directory", is_dir(folder)),
            (f"{path} exists", is_file(path)),
            (f"{path} holds exactly {word}", holds_exactly(path, word)),
            (f"{copy} exists", is_file(copy)),
            (f"{copy} holds exactly {word}", holds_exactly(copy, word)),
            (f"only {folder} and its two files in /app", only((folder, path, copy))),
        ),
        params=(directory, name, other, word),
    )
