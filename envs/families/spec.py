"""The task specification every family generator returns, and the shell snippets they share.

A ``TaskSpec`` is plain data: nothing in it touches the disk (``termgym.envs.families.writer``
turns one into a task directory). Its guarantees, which every generator keeps:

- ``commands`` is the reference solution, one shell command per agent turn, and each command is
  built from words that appear literally in ``instruction`` by a fixed pattern of its family;
- ``files`` are the environment's initial files, ``(absolute path, content)``, all under ``/app``;
- ``flaws`` are the scripted teacher's systematic mistakes (``Flaw``: what the teacher types
  instead, at a stated rate; ``termgym.envs.families.teacher``); every flaw's commands pass fewer
  assertions than the reference, so a flawed demonstration is never a resolved one;
- ``looks`` are the indices of ``commands`` that only read the environment (``cat``, ``ls``): a
  family that must find something out first; what they find is in ``files``, and the commands
  after them copy it from there, not from ``instruction``;
- ``assertions`` are ``(description, POSIX sh snippet)``, 3 to 20 of them (each family set
  narrows it: 3 to 6 in ``short``, 8 to 20 in ``long``); each snippet exits 0 when its
  requirement holds. Doing nothing passes none of them, and a command with a misspelt name never
  scores below stopping before it (``tests/envs/test_families.py``): trying is never worse than
  not trying.
"""

from __future__ import annotations

from dataclasses import dataclass

MIN_ASSERTIONS, MAX_ASSERTIONS = 3, 20


@dataclass(frozen=True)
class Flaw:
    """A systematic mistake of the scripted teacher: with probability ``rate`` it types
    ``commands`` instead of the reference (``mistake`` says what it got wrong, in a few words)."""

    mistake: str
    rate: float
    commands: tuple[str, ...]

    def __post_init__(self) -> None:
        if not 0.0 < self.rate < 1.0:
            raise ValueError(f"flaw {self.mistake!r}: rate {self.rate} is not strictly between 0 and 1")
        if not self.commands or any("\n" in c or not c.strip() for c in self.commands):
            raise ValueError(f"flaw {self.mistake!r}: commands must be non-empty single lines")


@dataclass(frozen=True)
class TaskSpec:
    """One generated task (see the module docstring for what every generator guarantees)."""

    name: str
    family: str
    instruction: str
    commands: tuple[str, ...]
    files: tuple[tuple[str, str], ...] = ()
    assertions: tuple[tuple[str, str], ...] = ()
    params: tuple[str, ...] = ()  # every drawn name and word, for the disjointness checks
    flaws: tuple[Flaw, ...] = ()
    looks: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.commands or any("\n" in c or not c.strip() for c in self.commands):
            raise ValueError(f"{self.name}: commands must be non-empty single lines")
        if not MIN_ASSERTIONS <= len(self.assertions) <= MAX_ASSERTIONS:
            raise ValueError(
                f"{self.name}: {len(self.assertions)} assertions, need {MIN_ASSERTIONS} to {MAX_ASSERTIONS}"
            )
        if any(not 0 <= i < len(self.commands) for i in self.looks):
            raise ValueError(f"{self.name}: a look index is not a command's")
        if sum(flaw.rate for flaw in self.flaws) >= 1.0:
            raise ValueError(f"{self.name}: the flaws' rates sum to 1 or more")
        for path, _ in self.files:
            if not path.startswith("/app/"):
                raise ValueError(f"{self.name}: initial file {path!r} is not under /app")


# -- check snippets (POSIX sh); paths are generated lowercase names, safe to embed unquoted --------


def is_file(path: str) -> str:
    return f"[ -f {path} ]"


def is_dir(path: str) -> str:
    return f"[ -d {path} ]"


def holds_exactly(path: str, word: str) -> str:
    """The file's content is ``word`` (trailing newlines are tolerated, nothing else is)."""
    return f'[ -f {path} ] && [ "$(cat {path})" = "{word}" ]'


def mentions(path: str, word: str) -> str:
    """The file contains ``word`` as a whole word somewhere (partial credit for near misses)."""
    return f"[ -f {path} ] && grep -qw -- {word} {path}"


def only(expected: tuple[str, ...]) -> str:
    """Every path of ``expected`` (absolute) exists, and nothing else under /app does. It fails for
    an untouched /app: an assertion that doing nothing passes would pay a policy for not trying,
    and one that a failed command keeps passing would pay it for failing harmlessly (PPO found
    that: writing into a directory that does not exist kept this check, a misspelt name lost it)."""
    present = " && ".join(f"[ -e {p} ]" for p in expected)
    keep = " ".join(f"-e {p}" for p in expected)
    return f'{present} && [ -z "$(find /app -mindepth 1 | grep -vxF {keep})" ]'
