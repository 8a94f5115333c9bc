"""``copy-file`` (1 turn): /app/SRC.txt exists; copy it to /app/DST.txt → ``cp /app/SRC.txt /app/DST.txt``."""

from __future__ import annotations

import random

from .names import NamePool
from .spec import TaskSpec, holds_exactly, is_file, only

FAMILY = "copy-file"


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Four assertions, none passed by doing nothing. The source's content (a drawn word) is not in
    the instruction: copying needs none."""
    source, dest, content = names.draw(rng, 3)
    src, dst = f"/app/{source}.txt", f"/app/{dest}.txt"
    return TaskSpec(
        name=f"{FAMILY}-{dest}",
        family=FAMILY,
        instruction=f"Copy the file {src} to {dst}.",
        commands=(f"cp {src} {dst}",),
        files=((src, content + "\n"),),
        assertions=(
            (f"{dst} exists", is_file(dst)),
            (f"{dst} has the content of {src}", holds_exactly(dst, content)),
            (f"{src} is still there, unchanged, beside the copy", f"{is_file(dst)} && {holds_exactly(src, content)}"),
            (f"only {src} and {dst} in /app", only((src, dst))),
        ),
        params=(source, dest, content),
    )
