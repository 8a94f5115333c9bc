"""Audit verdicts cached by task content, so that re-auditing an unchanged task costs nothing.

A verdict is keyed by the task directory's content (every file's relative path and bytes), the
audit's ``k`` and ``AUDIT_VERSION`` (raised whenever a check changes what it decides). Only
mechanical verdicts are cached: with a judge, every task is audited afresh.

Guarantees: a hit returns the verdict an earlier audit of byte-identical task files with the same
``k`` produced; changing any byte of the task (its instruction, Dockerfile, tests, solution,
task.toml) is a miss; ``save`` replaces the file atomically. A cache file that is not this
format is one ``ValueError`` line, never a silent empty cache.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from termgym.audit.rubric import Verdict
from termgym.errors import ConfigError
from termgym.tasks import Task

AUDIT_VERSION = 1


def task_digest(task_dir: Path) -> str:
    """SHA-256 over the sorted relative paths and bytes of every file under ``task_dir``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in task_dir.rglob("*") if p.is_file()):
        relative = path.relative_to(task_dir).as_posix().encode()
        data = path.read_bytes()
        digest.update(len(relative).to_bytes(8, "little") + relative + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


class AuditCache:
    def __init__(self, entries: dict[str, dict] | None = None) -> None:
        self.entries: dict[str, dict] = dict(entries or {})
        self.hits = 0

    @staticmethod
    def key(task: Task, k: int) -> str:
        return f"v{AUDIT_VERSION}/k{k}/{task_digest(Path(task.path))}"

    @classmethod
    def load(cls, path: str | os.PathLike) -> AuditCache:
        """The cache in ``path``; an empty one when the file does not exist."""
        target = Path(path)
        if not target.exists():
            return cls()
        try:
            data = json.loads(target.read_text(encoding="utf-8"))
            entries = data["entries"] if data.get("format") == "termgym-audit-cache" else None
        except (ValueError, AttributeError, KeyError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{target}: not an audit cache ({exc})") from None
        if not isinstance(entries, dict):
            raise ConfigError(f"{target}: not an audit cache (no 'format': 'termgym-audit-cache' with entries)")
        return cls(entries)

    def get(self, task: Task, k: int) -> Verdict | None:
        entry = self.entries.get(self.key(task, k))
        if entry is None:
            return None
        self.hits += 1
        return Verdict.from_dict(entry)

    def put(self, task: Task, k: int, verdict: Verdict) -> None:
        self.entries[self.key(task, k)] = verdict.to_dict()

    def save(self, path: str | os.PathLike) -> None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(target.name + ".tmp")
        payload = {"format": "termgym-audit-cache", "audit_version": AUDIT_VERSION, "entries": self.entries}
        temporary.write_text(json.dumps(payload, sort_keys=True, separators=(",", ":")) + "\n", encoding="utf-8")
        os.replace(temporary, target)
