"""``make-path`` (1 turn): ``mkdir -p /app/OUTER/INNER``, a directory whose parent does not exist.

The teacher forgets ``-p`` at a rate of 0.6: ``mkdir`` then fails and creates nothing."""

from __future__ import annotations

import random

from ..names import NamePool
from ..spec import Flaw, TaskSpec, is_dir, only

FAMILY = "make-path"
FORGETS_PARENTS = 0.6


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Four assertions, none passed by doing nothing or by the flawed ``mkdir``."""
    outer, inner = names.draw(rng, 2)
    parent, path = f"/app/{outer}", f"/app/{outer}/{inner}"
    return TaskSpec(
        name=f"{FAMILY}-{outer}",
        family=FAMILY,
        instruction=f"Create the directory {path} (its parent {parent} does not exist yet).",
        commands=(f"mkdir -p {path}",),
        assertions=(
            (f"{parent} is a directory", is_dir(parent)),
            (f"{path} is a directory", is_dir(path)),
            (f"{path} is empty", f'{is_dir(path)} && [ -z "$(ls -A {path})" ]'),
            (f"only {parent} and {path} in /app", only((parent, path))),
        ),
        params=(outer, inner),
        flaws=(Flaw("mkdir without -p", FORGETS_PARENTS, (f"mkdir {path}",)),),
    )
