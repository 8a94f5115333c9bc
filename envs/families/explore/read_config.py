"""``read-config`` (2 turns): ``cat /app/settings.conf``, then ``mkdir /app/NAME`` where NAME is the
value of its ``target`` key, which only the file says.

The teacher acts before looking at a rate of 0.6: it creates ``/app/target``, the key's name."""

from __future__ import annotations

import random

from ..names import NamePool
from ..spec import Flaw, TaskSpec, is_dir, only

FAMILY = "read-config"
CONFIG, KEY = "/app/settings.conf", "target"  # never drawn as a name (names.RESERVED): the guess stays wrong
GUESSES = 0.6


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Four assertions; doing nothing, reading the file alone, or the flawed guess pass none."""
    name, mode = names.draw(rng, 2)
    path = f"/app/{name}"
    unchanged = f"grep -qx {KEY}={name} {CONFIG}"
    return TaskSpec(
        name=f"{FAMILY}-{name}",
        family=FAMILY,
        instruction=f"Create the directory in /app named by the {KEY} key of {CONFIG}.",
        commands=(f"cat {CONFIG}", f"mkdir {path}"),
        files=((CONFIG, f"mode={mode}\n{KEY}={name}\n"),),
        assertions=(
            ("the directory the config names exists", f"[ -e {path} ]"),
            ("it is a directory", is_dir(path)),
            ("it is empty and the config is unchanged", f'{is_dir(path)} && [ -z "$(ls -A {path})" ] && {unchanged}'),
            (f"only {CONFIG} and that directory in /app", only((CONFIG, path))),
        ),
        params=(name, mode),
        flaws=(Flaw("acted before looking", GUESSES, (f"mkdir /app/{KEY}",)),),
        looks=(0,),
    )
