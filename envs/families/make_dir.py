"""``make-dir`` (1 turn): create the directory /app/DIR → ``mkdir /app/DIR``."""

from __future__ import annotations

import random

from .names import NamePool
from .spec import TaskSpec, is_dir, only

FAMILY = "make-dir"


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Four assertions, none passed by doing nothing."""
    (name,) = names.draw(rng, 1)
    path = f"/app/{name}"
    return TaskSpec(
        name=f"{FAMILY}-{name}",
        family=FAMILY,
        instruction=f"Create the directory {path}.",
        commands=(f"mkdir {path}",),
        assertions=(
            (f"{path} exists", f"[ -e {path} ]"),
            (f"{path} is a directory", is_dir(path)),
            (f"{path} is empty", f'{is_dir(path)} && [ -z "$(ls -A {path})" ]'),
            (f"only {path} in /app", only((path,))),
        ),
        params=(name,),
    )
