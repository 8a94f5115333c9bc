"""``dir-and-file`` (2 turns): ``mkdir /app/DIR`` then ``echo WORD > /app/DIR/NAME.txt``."""

from __future__ import annotations

import random

from .names import NamePool
from .spec import TaskSpec, holds_exactly, is_dir, is_file, only

FAMILY = "dir-and-file"


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Five assertions; doing nothing passes none, the first command one, both commands all five."""
    directory, name, word = names.draw(rng, 3)
    folder, path = f"/app/{directory}", f"/app/{directory}/{name}.txt"
    return TaskSpec(
        name=f"{FAMILY}-{directory}",
        family=FAMILY,
        instruction=f"Create the directory {folder}, then create the file {path} containing the word {word}.",
        commands=(f"mkdir {folder}", f"echo {word} > {path}"),
        assertions=(
            (f"{folder} is a directory", is_dir(folder)),
            (
                f"{folder} holds {name}.txt and nothing else",
                f'{is_file(path)} && [ -z "$(ls -A {folder} | grep -vxF {name}.txt)" ]',
            ),
            (f"{path} exists", is_file(path)),
            (f"{path} holds exactly {word}", holds_exactly(path, word)),
            (f"only {folder} and its file in /app", only((folder, path))),
        ),
        params=(directory, name, word),
    )
