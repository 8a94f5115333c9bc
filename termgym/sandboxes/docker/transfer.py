"""Files in and out of a container through the engine's archive API (``put_archive``,
``get_archive``): the container's own ``tar`` never runs, and what comes out is read as it
streams, up to a limit."""

from __future__ import annotations

import io
import posixpath
import tarfile
from collections.abc import Sequence
from typing import Any


class OverLimit(Exception):
    """An archive streamed past its byte limit."""


def archive_of(client: Any, container: str, paths: Sequence[str], limit: int) -> bytes:
    """One tar archive of the engine's archives of ``paths`` (those that exist), members named
    relative to ``/``; ``OverLimit`` once more than ``limit`` bytes have streamed in all."""
    import docker.errors

    out = io.BytesIO()
    received = 0
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target:
        for path in paths:
            data = bytearray()
            # The response itself (docker-py's get_archive hides it in a generator): closed on every
            # path out, so a read stopped at the limit leaves no socket to the engine open.
            url = client.api._url("/containers/{0}/archive", container)
            response = client.api.get(url, params={"path": path}, stream=True, headers={"Accept-Encoding": "identity"})
            try:
                try:
                    client.api._raise_for_status(response)
                except docker.errors.NotFound:
                    continue
                for chunk in response.iter_content(1 << 16):
                    received += len(chunk)
                    if received > limit:
                        raise OverLimit(path)
                    data += chunk
            finally:
                response.close()
            parent = posixpath.dirname("/" + path.strip("/")).strip("/")
            with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:") as source:
                for member in source:
                    file = source.extractfile(member) if member.isfile() else None
                    member.name = posixpath.join(parent, member.name) if parent else member.name
                    target.addfile(member, file)
    return out.getvalue() if received else b""


def rooted_archive(archive: bytes, dest: str) -> bytes:
    """``archive`` with every member moved under ``dest`` (absolute), named relative to ``/``."""
    prefix = dest.strip("/")
    if not prefix:
        return archive
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as source, tarfile.open(fileobj=out, mode="w") as target:
        for member in source:
            file = source.extractfile(member) if member.isfile() else None
            name = member.name.lstrip("/").removeprefix("./")
            member.name = f"{prefix}/{name}" if name not in ("", ".") else prefix
            target.addfile(member, file)
    return out.getvalue()
