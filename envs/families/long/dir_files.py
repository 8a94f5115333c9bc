"""``dir-files`` (4 or 5 turns): ``mkdir /app/DIR``, then ``echo WORD > /app/DIR/NAME.txt`` for
each of 3 or 4 files."""

from __future__ import annotations

import random

from ..names import NamePool
from ..spec import TaskSpec, is_dir, only
from .common import file_holds

FAMILY = "dir-files"


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """The directory, two assertions a file, nothing else in /app (8 or 10); each command passes
    at least one more."""
    count = rng.choice((3, 4))
    directory, *words = names.draw(rng, 1 + 2 * count)
    files, contents = words[:count], words[count:]
    folder = f"/app/{directory}"
    paths = [f"{folder}/{name}.txt" for name in files]
    parts = [f"{path} containing the word {word}" for path, word in zip(paths, contents)]
    return TaskSpec(
        name=f"{FAMILY}-{directory}",
        family=FAMILY,
        instruction=f"Create the directory {folder}, then in it " + ", then ".join(parts) + ".",
        commands=(f"mkdir {folder}", *(f"echo {word} > {path}" for path, word in zip(paths, contents))),
        assertions=(
            (f"{folder} is a directory", is_dir(folder)),
            *(check for path, word in zip(paths, contents) for check in file_holds(path, word)),
            (f"only {folder} and its {count} files in /app", only((folder, *paths))),
        ),
        params=(directory, *words),
    )
