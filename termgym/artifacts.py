"""Artifacts carried from the agent's sandbox into a separate verifier's: what may cross, and how.

A task graded in the separate mode names the paths its verifier needs (Harbor's top-level
``artifacts``); ``/logs/artifacts`` always goes too. The archive comes out of a sandbox the agent
controlled, so it is untrusted: ``safe_artifacts`` re-packs it keeping only regular files and
directories that lie under one of the declared paths, with relative names free of ``..``, modes cut
to the permission bits (no set-uid, set-gid or sticky bit) and root as owner. Links, devices,
FIFOs, sparse members, names too long to unpack, entries that conflict with one kept before, and
anything outside the declared paths are dropped, and so are files past the byte limit; a malformed
archive is ``ValueError``.

Pure: bytes in, bytes out.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from pathlib import PurePosixPath

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
