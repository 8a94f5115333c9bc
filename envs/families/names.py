"""Pronounceable random names, partitioned between the training and the held-out split.

Every name and word a family generator uses comes from ``NamePool.draw``. Guarantees:

- a name is 3 to 9 lowercase ASCII letters (at most ``NamePool.longest``), built from
  consonant-vowel syllables, so it is safe unquoted in a shell command and in a file name;
- ``split_of(word)`` is a fixed function of the word alone (a salted SHA-256), and a pool only
  ever returns words of its own split, so no held-out name or word can occur in a training task,
  whatever the seeds (about a quarter of the name space is held out);
- ``draw`` is deterministic in the ``random.Random`` state it is given, and never returns a
  ``RESERVED`` word (a command or a fixed path of some family), which would otherwise be a
  held-out name that training text holds.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from termgym.errors import UnknownName

SPLITS = ("train", "heldout")
ONSETS = (
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "j",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "w",
    "z",
    "br",
    "ch",
    "dr",
    "gl",
    "pl",
    "sh",
    "st",
    "tr",
)
VOWELS = ("a", "e", "i", "o", "u", "a", "e", "i", "o", "ai", "ou")
CODAS = ("", "", "", "", "n", "r", "s", "l", "m", "k", "t")
MIN_LENGTH, MAX_LENGTH = 3, 9
# words every task's text may hold (commands, fixed paths and keys): never drawn as a name
RESERVED = frozenset("app cat conf cp echo file inbox ls mkdir mode mv settings target touch txt".split())
_SALT = b"termgym.envs.families/split/"
_HELDOUT_SHARE = 64  # of 256: the first digest byte below it puts a word in the held-out split


def split_of(word: str) -> str:
    """The split a word belongs to, whoever draws it."""
    return "heldout" if hashlib.sha256(_SALT + word.encode()).digest()[0] < _HELDOUT_SHARE else "train"


def pronounceable(rng: random.Random, longest: int = MAX_LENGTH) -> str:
    """A random word of 3 to ``longest`` letters (length uniform), syllable by syllable, cut to length."""
    length = rng.randint(MIN_LENGTH, longest)
    word = ""
    while len(word) < length:
        word += rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS)
    return word[:length]


@dataclass(frozen=True)
class NamePool:
    """The names of one split: ``draw`` returns fresh, distinct words of that split only."""

    split: str
    longest: int = MAX_LENGTH  # letters in the longest name drawn

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise UnknownName("unknown split", self.split, SPLITS)
        if not MIN_LENGTH <= self.longest <= MAX_LENGTH:
            raise ValueError(f"longest must be from {MIN_LENGTH} to {MAX_LENGTH}, got {self.longest}")

    def draw(self, rng: random.Random, count: int = 1) -> tuple[str, ...]:
        words: list[str] = []
        while len(words) < count:
            word = pronounceable(rng, self.longest)
            if split_of(word) == self.split and word not in words and word not in RESERVED:
                words.append(word)
        return tuple(words)
