"""The task's artifacts: what crosses from the agent's sandbox, into a separate verifier's and into
the trial's directory, and how.

A task names paths its verifier needs or its author wants kept (Harbor's top-level ``artifacts``);
``/logs/artifacts`` always goes too (``artifact_paths``). The archive comes out of a sandbox the
agent controlled, so it is untrusted: ``safe_artifacts`` (pure: bytes in, bytes out) re-packs it
keeping only regular files and directories that lie under one of the declared paths, with relative
names free of ``..``, modes cut to the permission bits (no set-uid, set-gid or sticky bit) and root
as owner. Links, devices, FIFOs, sparse members, names too long to unpack, entries that conflict
with one kept before, and anything outside the declared paths are dropped, and so are files past
the byte limit; a malformed archive is ``ValueError``. The separate verification mode uploads what
it keeps into the fresh sandbox.

``export_artifacts`` copies them into the trial's directory after the episode, as Harbor keeps
them: it downloads the paths (one archive, at most ``MAX_ARTIFACT_BYTES``: the backend reads it
from the engine or the host, bounded as it streams), keeps what ``safe_artifacts`` lets through and
unpacks it under ``<trial dir>/artifacts/`` at the paths they had in the sandbox (``/app/out.txt``
-> ``artifacts/app/out.txt``), with the data filter of ``tarfile`` as a second guard. It never
raises for what the sandbox holds: an archive over the limit, unreadable or malformed, or entries
dropped, are warnings. It returns the files kept, relative to the trial directory, sorted.
"""

from __future__ import annotations

import asyncio
import io
import tarfile
from collections.abc import Sequence
from pathlib import Path, PurePosixPath

from termgym.errors import SandboxError
from termgym.sandboxes.base import Sandbox

LOGS_ARTIFACTS = "/logs/artifacts"
MAX_ARTIFACT_BYTES = 64 << 20


def artifact_paths(declared: Sequence[str]) -> list[str]:
    """The declared paths and ``/logs/artifacts``, absolute, each once, in order."""
    paths: list[str] = []
    for path in [*declared, LOGS_ARTIFACTS]:
        normal = "/" + path.strip("/")
        if normal != "/" and normal not in paths:
            paths.append(normal)
    return paths


def safe_artifacts(
    archive: bytes, allowed: Sequence[str], *, limit: int = MAX_ARTIFACT_BYTES
) -> tuple[bytes, list[str]]:
    """``(re-packed archive, names dropped)``: names relative to ``/``, as ``tar -C /`` reads them.
    Besides what the module's docstring lists, a member is dropped when it is sparse (its header
    claims more than it holds), when its name is longer than a path may be here, when it conflicts
    with one kept before (the same name again, a file where a directory was kept or below a
    kept file), or when the files' sizes would add up to more than ``limit`` bytes: whatever the
    archive claims, unpacking what is kept writes at most ``limit`` bytes of files. Names that are
    not UTF-8 are decoded with replacement characters."""
    roots = [PurePosixPath(path.strip("/")) for path in allowed]
    out = io.BytesIO()
    dropped: list[str] = []
    files: set[PurePosixPath] = set()
    directories: set[PurePosixPath] = set()
    left = limit
    try:
        source = tarfile.open(fileobj=io.BytesIO(archive), mode="r:", errors="replace")
    except tarfile.TarError as exc:
        raise ValueError(f"the artifacts are not a tar archive: {exc}") from None
    with source, tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target:
        try:
            for member in source:
                name = PurePosixPath(member.name.lstrip("/").removeprefix("./"))
                if not _keepable(member, name, roots, files, directories) or (member.isfile() and member.size > left):
                    dropped.append(member.name)
                    continue
                info = tarfile.TarInfo(str(name))
                info.type, info.size, info.mtime = member.type, member.size if member.isfile() else 0, member.mtime
                info.mode = member.mode & 0o777
                info.uid = info.gid = 0
                info.uname = info.gname = "root"
                content = source.extractfile(member) if member.isfile() else None
                target.addfile(info, content)
                if member.isfile():
                    left -= member.size
                    files.add(name)
                else:
                    directories.add(name)
                directories.update(name.parents)
        except (tarfile.TarError, EOFError, OSError) as exc:
            raise ValueError(f"the artifacts' archive is malformed: {exc}") from None
    return out.getvalue(), dropped


MAX_NAME_BYTES = 255  # one component of a path (NAME_MAX)
MAX_PATH_BYTES = 3072  # a whole name, short of PATH_MAX (4096) once under a trial directory


def _keepable(
    member: tarfile.TarInfo,
    name: PurePosixPath,
    roots: Sequence[PurePosixPath],
    files: set[PurePosixPath],
    directories: set[PurePosixPath],
) -> bool:
    """Whether ``member`` (named ``name``) may be kept, given the files and directories kept before."""
    if name.is_absolute() or ".." in name.parts or not name.parts or member.issparse():
        return False
    if not (member.isfile() or member.isdir()):
        return False
    encoded = [part.encode("utf-8", errors="replace") for part in name.parts]
    if len(b"/".join(encoded)) > MAX_PATH_BYTES or any(len(part) > MAX_NAME_BYTES for part in encoded):
        return False
    if not any(_under(name, root) or (member.isdir() and name in root.parents) for root in roots):
        return False
    if name in files or any(parent in files for parent in name.parents):
        return False  # the same file again, or something below a file
    return not (member.isfile() and name in directories)  # a file where a directory is


def _under(name: PurePosixPath, root: PurePosixPath) -> bool:
    return name == root or root in name.parents


# -- copied out after the episode ---------------------------------------------------------------

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
