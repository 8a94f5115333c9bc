"""The task's ``artifacts`` (and ``/logs/artifacts``) copied out of the sandbox into the trial's
directory after the episode, as Harbor keeps them.

``export_artifacts`` downloads the paths (one archive, at most ``MAX_ARTIFACT_BYTES``), keeps what
``termgym.artifacts.safe_artifacts`` lets through (regular files and directories under the
declared paths, no links, no ``..``, no sparse members, at most the limit in all) and unpacks it under ``<trial dir>/artifacts/`` at the
paths they had in the sandbox (``/app/out.txt`` -> ``artifacts/app/out.txt``), with the data
filter of ``tarfile`` as a second guard. It never raises for what the sandbox holds: an archive over
the limit, unreadable or malformed, or entries dropped, are warnings. It returns the files kept,
relative to the trial directory, sorted.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import Sequence
from pathlib import Path

from termgym.artifacts import MAX_ARTIFACT_BYTES, artifact_paths, safe_artifacts
from termgym.errors import SandboxError
from termgym.sandboxes.base import Sandbox

ARTIFACTS_DIR = "artifacts"


async def export_artifacts(
    sandbox: Sandbox, declared: Sequence[str], trial_dir: Path, *, limit: int = MAX_ARTIFACT_BYTES
) -> tuple[list[str], list[str]]:
    """``(files kept relative to trial_dir, warnings)``; see the module's docstring."""
    paths = artifact_paths(declared)
    try:
        archive = await sandbox.download_tar(paths, limit=limit)
    except SandboxError as exc:
        return [], [f"the artifacts were not kept: {exc}"]
    if not archive:
        return [], []
    try:
        cleaned, dropped = safe_artifacts(archive, paths, limit=limit)
    except ValueError as exc:
        return [], [f"the artifacts were not kept: {exc}"]
    warnings = [f"{len(dropped)} artifact entries were not kept ({DROPPED})"] if dropped else []
    try:
        files = await asyncio.to_thread(unpack, cleaned, trial_dir / ARTIFACTS_DIR)
    except (OSError, tarfile.TarError) as exc:
        return [], [*warnings, f"the artifacts were not kept: {getattr(exc, 'strerror', None) or exc}"]
    return [f"{ARTIFACTS_DIR}/{name}" for name in files], warnings


DROPPED = (
    "links, devices, sparse files, names too long or in conflict, outside the declared paths, or past the size limit"
)


def unpack(archive: bytes, dest: Path) -> list[str]:
    """Unpack a ``safe_artifacts`` archive under ``dest``; the regular files' names, sorted."""
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as source:
        members = source.getmembers()
        source.extractall(dest, filter="data")
    return sorted(member.name for member in members if member.isfile())
