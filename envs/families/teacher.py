"""The scripted teacher: what it types for a generated task, mistakes included.

A real model's distilled trajectories are not the reference solution: they usually solve the
task, with systematic mistakes. The teacher types a task's reference commands, except that with
each of the task's flaws' rates (``solution/teacher.json``, written from ``TaskSpec.flaws``) it
types that flaw's commands instead. Guarantees:

- deterministic in ``(seed, the task directory's name)``: the same run draws the same mistakes,
  whichever order the tasks are visited in, and another seed draws others;
- one uniform draw per task, against the flaws' cumulative rates, so each flaw's rate is exactly
  the probability that the teacher makes that mistake on a task of its family;
- a task without ``teacher.json`` (any family without flaws) gets its reference commands.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path

from .writer import reference_commands


@dataclass(frozen=True)
class TeacherChoice:
    """What the teacher types for one task; ``mistake`` is None when it types the reference."""

    commands: tuple[str, ...]
    mistake: str | None = None


def teacher_commands(task_dir: str | os.PathLike[str], seed: int) -> TeacherChoice:
    """The teacher's commands for the generated task in ``task_dir`` (see the module docstring).

    Raises ``ValueError`` for a ``teacher.json`` that is not the writer's."""
    root = Path(task_dir)
    reference = tuple(reference_commands(root))
    listing = root / "solution" / "teacher.json"
    if not listing.exists():
        return TeacherChoice(reference)
    try:
        flaws = json.loads(listing.read_text(encoding="utf-8"))["flaws"]
        draws = [(float(f["rate"]), str(f["mistake"]), tuple(str(c) for c in f["commands"])) for f in flaws]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{listing}: not a teacher's list of flaws ({exc})") from None
    u, cumulative = random.Random(f"termgym.envs.families.teacher/{seed}/{root.name}").random(), 0.0
    for rate, mistake, commands in draws:
        cumulative += rate
        if u < cumulative:
            return TeacherChoice(commands, mistake)
    return TeacherChoice(reference)
