"""``copy-chain`` (6 to 8 turns, the long family): ``echo WORD > /app/A.txt``, then each file
copied to the next: ``cp /app/A.txt /app/B.txt``, ``cp /app/B.txt /app/C.txt``, ..."""

from __future__ import annotations

import random
from itertools import pairwise

from ..names import NamePool
from ..spec import TaskSpec, only
from .common import file_holds

FAMILY = "copy-chain"


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Two assertions a file and nothing else in /app (13 to 17); each command passes two more."""
    copies = rng.choice((5, 6, 7))
    word, *files = names.draw(rng, 2 + copies)
    paths = [f"/app/{name}.txt" for name in files]
    steps = [f"copy {src} to {dst}" for src, dst in pairwise(paths)]
    return TaskSpec(
        name=f"{FAMILY}-{files[0]}",
        family=FAMILY,
        instruction=f"Create {paths[0]} containing the word {word}, then " + ", then ".join(steps) + ".",
        commands=(f"echo {word} > {paths[0]}", *(f"cp {src} {dst}" for src, dst in pairwise(paths))),
        assertions=(
            *(check for path in paths for check in file_holds(path, word)),
            (f"only the {len(paths)} files of the chain in /app", only(tuple(paths))),
        ),
        params=(word, *files),
    )
