"""``file-set`` (4 or 5 turns): ``echo WORD > /app/NAME.txt`` for each of 4 or 5 files."""

from __future__ import annotations

import random

from ..names import NamePool
from ..spec import TaskSpec, only
from .common import file_holds

FAMILY = "file-set"


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Two assertions a file and one for nothing else in /app (9 or 11); each command passes two more."""
    count = rng.choice((4, 5))
    words = names.draw(rng, 2 * count)
    files, contents = words[:count], words[count:]
    paths = [f"/app/{name}.txt" for name in files]
    parts = [f"{path} containing the word {word}" for path, word in zip(paths, contents)]
    return TaskSpec(
        name=f"{FAMILY}-{files[0]}",
        family=FAMILY,
        instruction=f"Create {count} files, one word in each: " + ", then ".join(parts) + ".",
        commands=tuple(f"echo {word} > {path}" for path, word in zip(paths, contents)),
        assertions=(
            *(check for path, word in zip(paths, contents) for check in file_holds(path, word)),
            (f"only the {count} files in /app", only(tuple(paths))),
        ),
        params=words,
    )
