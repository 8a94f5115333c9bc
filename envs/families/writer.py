"""Turn a ``TaskSpec`` into a Harbor-layout task directory termgym loads, and read it back.

The directory: ``task.toml`` (small timeouts, ``[metadata]`` with the family as category, the
split and the generation seed), ``instruction.md``, ``environment/Dockerfile`` (``FROM
debian:bookworm-slim``, ``WORKDIR /app``, and one ``RUN`` writing the initial files when there are
any: cheap on the embedded backend, where each step is one command in the sandbox),
``solution/solve.sh`` (``#!/bin/sh`` then exactly the reference commands, one per line) and
``tests/test.sh`` (the assertion kit, one ``tg_check_sh`` per assertion), and, for a family with
teacher's mistakes, ``solution/teacher.json`` (its flaws: ``termgym.envs.families.teacher``). The verifier declares its
report (``ctrf``, the kit's) and its number of assertions, so no other report and no other count is
ever graded.

``reference_commands`` reads ``solve.sh`` back: for a written task it returns ``spec.commands``.
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
from pathlib import Path

from .spec import TaskSpec

SHEBANG = "#!/bin/sh"
KIT = '. "${TERMGYM_ASSERT:-/tests/.termgym/assert.sh}"'
AGENT_TIMEOUT_SEC = 60.0  # the whole episode, policy time included (EnvOptions.agent_timeout overrides)
VERIFIER_TIMEOUT_SEC = 30.0
BUILD_TIMEOUT_SEC = 60.0


def task_toml(spec: TaskSpec, *, split: str, seed: int, index: int) -> str:
    return (
        'schema_version = "1.1"\n\n'
        "[task]\n"
        f"name = {json.dumps(f'families/{split}/{spec.name}')}\n\n"
        "[metadata]\n"
        f"category = {json.dumps(spec.family)}\n"
        f"split = {json.dumps(split)}\n"
        f"seed = {int(seed)}\n"
        f"index = {int(index)}\n"
        f"turns = {len(spec.commands)}\n"
        'generator = "termgym.envs.families"\n\n'
        f"[agent]\ntimeout_sec = {AGENT_TIMEOUT_SEC}\n\n"
        f"[verifier]\ntimeout_sec = {VERIFIER_TIMEOUT_SEC}\n"
        'report_format = "ctrf"\n'
        f"assertions = {len(spec.assertions)}\n\n"
        "[environment]\n"
        f"build_timeout_sec = {BUILD_TIMEOUT_SEC}\n"
        "cpus = 1\nmemory_mb = 256\nstorage_mb = 64\n"
        'network_mode = "no-network"\n'
    )


def dockerfile(spec: TaskSpec) -> str:
    lines = ["FROM debian:bookworm-slim", "WORKDIR /app"]
    if spec.files:
        lines.append("RUN " + " && ".join(_write_file(path, content) for path, content in spec.files))
    return "\n".join(lines) + "\n"


def _write_file(path: str, content: str) -> str:
    """A one-line shell command writing ``content`` (whole lines: a Dockerfile line cannot hold a
    newline inside quotes)."""
    if not content.endswith("\n"):
        raise ValueError(f"initial file {path}: content must end with a newline")
    words = " ".join(shlex.quote(line) for line in content[:-1].split("\n"))
    parent = posixpath.dirname(path)
    made = f"mkdir -p {shlex.quote(parent)} && " if parent != "/app" else ""
    return f"{made}printf '%s\\n' {words} > {shlex.quote(path)}"


def solve_sh(spec: TaskSpec) -> str:
    return "\n".join([SHEBANG, *spec.commands]) + "\n"


def test_sh(spec: TaskSpec) -> str:
    checks = [f"tg_check_sh {shlex.quote(d)} {shlex.quote(check)}" for d, check in spec.assertions]
    return "\n".join(["#!/bin/sh", KIT, *checks, "tg_finish"]) + "\n"


def teacher_json(spec: TaskSpec) -> str:
    flaws = [{"mistake": f.mistake, "rate": f.rate, "commands": list(f.commands)} for f in spec.flaws]
    return json.dumps({"flaws": flaws}, indent=2) + "\n"


def write_task(spec: TaskSpec, task_dir: str | os.PathLike[str], *, split: str, seed: int, index: int) -> Path:
    """Write ``spec`` as a task directory (created; it must not exist yet); returns its path."""
    root = Path(task_dir)
    root.mkdir(parents=True, exist_ok=False)
    for sub in ("environment", "solution", "tests"):
        (root / sub).mkdir()
    (root / "task.toml").write_text(task_toml(spec, split=split, seed=seed, index=index))
    (root / "instruction.md").write_text(spec.instruction + "\n")
    (root / "environment" / "Dockerfile").write_text(dockerfile(spec))
    (root / "solution" / "solve.sh").write_text(solve_sh(spec))
    (root / "tests" / "test.sh").write_text(test_sh(spec))
    if spec.flaws:
        (root / "solution" / "teacher.json").write_text(teacher_json(spec))
    for script in (root / "solution" / "solve.sh", root / "tests" / "test.sh"):
        script.chmod(0o755)
    return root


def reference_commands(task_dir: str | os.PathLike[str]) -> list[str]:
    """The reference solution of a generated task, one shell command per agent turn.

    Raises ``ValueError`` when ``solution/solve.sh`` is not in the generated form (``#!/bin/sh``
    then one command per line)."""
    script = Path(task_dir) / "solution" / "solve.sh"
    lines = script.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0] != SHEBANG:
        raise ValueError(f"{script}: not a generated solution (first line must be {SHEBANG})")
    commands = [line for line in lines[1:] if line.strip()]
    if not commands:
        raise ValueError(f"{script}: no command")
    return commands
