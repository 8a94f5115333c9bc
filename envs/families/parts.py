"""The ``parts`` family set (issue 44): tasks of several independent parts, where a dense reward and
a binary one can differ.

A task asks for 3, 4 or 5 separate small things in /app (the families ``three-parts``,
``four-parts`` and ``five-parts``), one shell command each, and checks each with exactly one
assertion of its own; no part touches another's files, so any subset of the parts can be right.
The parts are of three kinds (``write``, ``nest``, ``copy``), each with the scripted teacher's
mistake for it at the explore set's rate; the teacher makes each part's mistake independently.

Guarantees, besides ``TaskSpec``'s: part ``i``'s command is ``commands[i]`` and its assertion is
``assertions[i]``; each command passes its own assertion and changes no other's outcome, so a
prefix of the reference passes exactly the assertions of its parts; every flaw fails exactly the
assertions of the parts it names.

The kinds, the teacher's rates and what they give: docs/guides/tasks.md#the-parts-family-set."""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from .names import NamePool
from .spec import Flaw, TaskSpec, holds_exactly, is_dir

FORGETS_CONTENT, FORGETS_PARENTS, MOVES = 0.3, 0.6, 0.6  # the explore set's rates for these mistakes


@dataclass(frozen=True)
class Part:
    """One part of a task: what the instruction says, the command that does it, the one assertion
    that checks it, the teacher's mistake for it, and its initial files."""

    kind: str
    says: str
    command: str
    assertion: tuple[str, str]
    mistake: str
    rate: float
    flawed: str
    files: tuple[tuple[str, str], ...] = ()
    params: tuple[str, ...] = ()


def write(names: tuple[str, ...]) -> Part:
    name, word = names
    path = f"/app/{name}.txt"
    return Part(
        "write",
        f"Create the file {path} containing the word {word}.",
        f"echo {word} > {path}",
        (f"{path} holds exactly {word}", holds_exactly(path, word)),
        "touched the file and forgot its content",
        FORGETS_CONTENT,
        f"touch {path}",
        params=names,
    )


def nest(names: tuple[str, ...]) -> Part:
    outer, inner = names
    path = f"/app/{outer}/{inner}"
    return Part(
        "nest",
        f"Create the directory {path} (its parent /app/{outer} does not exist yet).",
        f"mkdir -p {path}",
        (f"{path} is a directory", is_dir(path)),
        "mkdir without -p",
        FORGETS_PARENTS,
        f"mkdir {path}",
        params=names,
    )


def copy(names: tuple[str, ...]) -> Part:
    source, dest, content = names
    src, dst = f"/app/{source}.txt", f"/app/{dest}.txt"
    return Part(
        "copy",
        f"Copy the file {src} to {dst}.",
        f"cp {src} {dst}",
        (
            f"{dst} has the content of {src}, which is still there",
            f"{holds_exactly(dst, content)} && {holds_exactly(src, content)}",
        ),
        "moved instead of copying",
        MOVES,
        f"mv {src} {dst}",
        files=((src, content + "\n"),),
        params=names,
    )


KINDS: dict[str, tuple[int, Callable[[tuple[str, ...]], Part]]] = {
    "write": (2, write),
    "nest": (2, nest),
    "copy": (3, copy),
}  # a kind's count of drawn names, and its part


def flaws_of(parts: tuple[Part, ...]) -> tuple[Flaw, ...]:
    """Pure: the teacher's independent mistakes as ``Flaw``s, one per non-empty set of mistaken
    parts (smallest sets first), at the probability that it makes exactly those mistakes."""
    flaws = []
    for size in range(1, len(parts) + 1):
        for wrong in itertools.combinations(range(len(parts)), size):
            rate = math.prod(p.rate if i in wrong else 1.0 - p.rate for i, p in enumerate(parts))
            commands = tuple(p.flawed if i in wrong else p.command for i, p in enumerate(parts))
            mistake = "; ".join(f"part {i + 1}: {parts[i].mistake}" for i in wrong)
            flaws.append(Flaw(mistake, rate, commands))
    return tuple(flaws)


def task_of(family: str, parts: tuple[Part, ...]) -> TaskSpec:
    """Pure: the task that asks for ``parts``, in order."""
    count = len(parts)
    steps = " ".join(f"({i}) {p.says}" for i, p in enumerate(parts, start=1))
    return TaskSpec(
        name=f"{family}-{parts[0].params[0]}",
        family=family,
        instruction=f"Do these {count} separate things, one command each: {steps}",
        commands=tuple(p.command for p in parts),
        files=tuple(f for p in parts for f in p.files),
        assertions=tuple(p.assertion for p in parts),
        params=tuple(w for p in parts for w in p.params),
        flaws=flaws_of(parts),
    )


def draw_parts(rng: random.Random, names: NamePool, count: int) -> tuple[Part, ...]:
    """``count`` parts: one of each kind, then kinds drawn uniformly, in a shuffled order; every
    name and word distinct across the parts."""
    kinds = list(KINDS) + [rng.choice(list(KINDS)) for _ in range(count - len(KINDS))]
    rng.shuffle(kinds)
    words = iter(names.draw(rng, sum(KINDS[k][0] for k in kinds)))
    return tuple(KINDS[k][1](tuple(itertools.islice(words, KINDS[k][0]))) for k in kinds)


def family(name: str, count: int) -> Callable[[random.Random, NamePool], TaskSpec]:
    def make(rng: random.Random, names: NamePool) -> TaskSpec:
        return task_of(name, draw_parts(rng, names, count))

    make.__doc__ = f"A task of {count} independent parts, one assertion each."
    return make


FAMILIES: dict[str, Callable[[random.Random, NamePool], TaskSpec]] = {
    f"{word}-parts": family(f"{word}-parts", count) for word, count in (("three", 3), ("four", 4), ("five", 5))
}
