"""``find-file`` (2 turns): ``ls /app/inbox``, then ``cp /app/inbox/NAME.txt /app/DEST.txt``: the
inbox's one file, whose name only the listing shows.

The teacher acts before looking at a rate of 0.6: it copies ``/app/inbox/file.txt``, which is
not there."""

from __future__ import annotations

import random

from ..names import NamePool
from ..spec import Flaw, TaskSpec, holds_exactly, is_file, only

FAMILY = "find-file"
INBOX, GUESS = "/app/inbox", "file"  # never drawn as a name (names.RESERVED): the guess stays wrong
GUESSES = 0.6


def make(rng: random.Random, names: NamePool) -> TaskSpec:
    """Four assertions; doing nothing, listing alone, or the flawed guess pass none."""
    name, dest, word = names.draw(rng, 3)
    found, copy = f"{INBOX}/{name}.txt", f"/app/{dest}.txt"
    return TaskSpec(
        name=f"{FAMILY}-{dest}",
        family=FAMILY,
        instruction=f"The directory {INBOX} holds one file. Copy it to {copy}.",
        commands=(f"ls {INBOX}", f"cp {found} {copy}"),
        files=((found, word + "\n"),),
        assertions=(
            (f"{copy} exists", is_file(copy)),
            (f"{copy} has the content of the inbox's file", holds_exactly(copy, word)),
            ("the inbox's file is still there, unchanged", f"{is_file(copy)} && {holds_exactly(found, word)}"),
            (f"only the inbox, its file and {copy} in /app", only((INBOX, found, copy))),
        ),
        params=(name, dest, word),
        flaws=(Flaw("acted before looking", GUESSES, (f"cp {INBOX}/{GUESS}.txt {copy}",)),),
        looks=(0,),
    )
