"""Artifacts carried from the agent's sandbox into a separate verifier's: what may cross, and how.

A task graded in the separate mode names the paths its verifier needs (Harbor's top-level
``artifacts``); ``/logs/artifacts`` always goes too. The archive comes out of a sandbox the agent
controlled, so it is untrusted: ``safe_artifacts`` re-packs it keeping only regular files and
directories that lie under one of the declared paths, with relative names free of ``..``, modes cut
to the permission bits (no set-uid, set-gid or sticky bit) and root as owner. Links, devices,
FIFOs, and anything outside the declared paths are dropped; a malformed archive is ``ValueError``.

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


def safe_artifacts(archive: bytes, allowed: Sequence[str]) -> tuple[bytes, list[str]]:
    """``(re-packed archive, names dropped)``: names relative to ``/``, as ``tar -C /`` reads them."""
    roots = [PurePosixPath(path.strip("/")) for path in allowed]
    out = io.BytesIO()
    dropped: list[str] = []
    try:
        source = tarfile.open(fileobj=io.BytesIO(archive), mode="r:")
    except tarfile.TarError as exc:
        raise ValueError(f"the artifacts are not a tar archive: {exc}") from None
    with source, tarfile.open(fileobj=out, mode="w") as target:
        try:
            members = source.getmembers()
        except tarfile.TarError as exc:
            raise ValueError(f"the artifacts' archive is malformed: {exc}") from None
        for member in members:
            name = PurePosixPath(member.name.lstrip("/").removeprefix("./"))
            inside = not name.is_absolute() and ".." not in name.parts and name.parts
            wanted = any(_under(name, root) or (member.isdir() and name in root.parents) for root in roots)
            if not inside or not (member.isfile() or member.isdir()) or not wanted:
                dropped.append(member.name)
                continue
            info = tarfile.TarInfo(str(name))
            info.type, info.size, info.mtime = member.type, member.size if member.isfile() else 0, member.mtime
            info.mode = member.mode & 0o777
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            target.addfile(info, source.extractfile(member) if member.isfile() else None)
    return out.getvalue(), dropped


def _under(name: PurePosixPath, root: PurePosixPath) -> bool:
    return name == root or root in name.parents
