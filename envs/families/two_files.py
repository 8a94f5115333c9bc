"""``two-files`` (2 turns, held out: never in training): ``echo W1 > /app/A.txt`` then
``echo W2 > /app/B.txt``. Its instruction template is unseen in training; its skill (the
``write-file`` command, twice) is not."""

from __future__ import annotations

import random

from .names import NamePool
from .spec import TaskSpec, holds_exactly, is_file, only

FAMILY = "two-files"


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Five assertions; doing nothing passes none, the first command two, both all five."""
    first, second, word1, word2 = names.draw(rng, 4)
    a, b = f"/app/{first}.txt", f"/app/{second}.txt"
    return TaskSpec(
        name=f"{FAMILY}-{first}",
        family=FAMILY,
        instruction=f"Create {a} containing the word {word1} and {b} containing the word {word2}.",
        commands=(f"echo {word1} > {a}", f"echo {word2} > {b}"),
        assertions=(
            (f"{a} exists", is_file(a)),
            (f"{a} holds exactly {word1}", holds_exactly(a, word1)),
            (f"{b} exists", is_file(b)),
            (f"{b} holds exactly {word2}", holds_exactly(b, word2)),
            (f"only {a} and {b} in /app", only((a, b))),
        ),
        params=(first, second, word1, word2),
    )
