"""Files from the host into a sandbox, built only on the contract (``termgym.sandboxes.base``): tar
archives made on the host (``tar_of_files``) and ``upload_files``."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Sequence
from pathlib import Path

from termgym.sandboxes.base import Sandbox


def tar_of_files(files: Sequence[tuple[Path, str]], blobs: Sequence[tuple[str, bytes, int]] = ()) -> bytes:
    """A tar archive (in memory) of host files at the given relative paths, plus in-memory
    ``(relative path, content, mode)`` blobs; owned by root; parent directories implicit."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for host_path, relative in files:
            info = archive.gettarinfo(str(host_path), arcname=relative.lstrip("/"))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isfile():
                with open(host_path, "rb") as handle:
                    archive.addfile(info, handle)
            else:
                archive.addfile(info)
        for relative, content, mode in blobs:
            info = tarfile.TarInfo(relative.lstrip("/"))
            info.size, info.mode = len(content), mode
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


async def upload_files(sandbox: Sandbox, files: Sequence[tuple[Path, str]], dest: str) -> None:
    """Copy host files into ``dest``, each at its relative path, executable bits kept."""
    await sandbox.upload_tar(tar_of_files(files), dest)
