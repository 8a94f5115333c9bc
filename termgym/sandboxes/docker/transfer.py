"""Files in and out of a container through the engine's archive API (``put_archive``,
``get_archive``): the container's own ``tar`` never runs, and what comes out is read as it
streams, up to a limit. A path is read literally and a link as the link, on Podman too
(``Dialect.archive_path``, ``Dialect.follows_links``)."""

from __future__ import annotations

import base64
import io
import json
import posixpath
import tarfile
from collections.abc import Sequence
from typing import Any

from termgym.sandboxes.docker.engine import dialect_of

MODE_SYMLINK = 1 << 27  # Go's os.ModeSymlink, in the mode of the archive's stat header


class OverLimit(Exception):
    """An archive streamed past its byte limit."""


def archive_of(client: Any, container: str, paths: Sequence[str], limit: int) -> bytes:
    """One tar archive of the engine's archives of ``paths`` (those that exist), members named
    relative to ``/``; ``OverLimit`` once more than ``limit`` bytes have streamed in all."""
    import docker.errors

    dialect = dialect_of(client)
    out = io.BytesIO()
    received, found = 0, False
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target:
        for path in paths:
            data = bytearray()
            parent = posixpath.dirname("/" + path.strip("/")).strip("/")
            # The response itself (docker-py's get_archive hides it in a generator): closed on every
            # path out, so a read stopped at the limit leaves no socket to the engine open.
            url = client.api._url("/containers/{0}/archive", container)
            query = {"path": dialect.archive_path(path)}
            response = client.api.get(url, params=query, stream=True, headers={"Accept-Encoding": "identity"})
            try:
                try:
                    client.api._raise_for_status(response)
                except docker.errors.NotFound:
                    continue
                found = True
                link = link_member(path, response.headers.get("X-Docker-Container-Path-Stat"))
                if link is not None and dialect.follows_links:  # what it leads to is not read
                    link.name = posixpath.join(parent, link.name) if parent else link.name
                    target.addfile(link)
                    continue
                for chunk in response.iter_content(1 << 16):
                    received += len(chunk)
                    if received > limit:
                        raise OverLimit(path)
                    data += chunk
            finally:
                response.close()
            with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:") as source:
                for member in source:
                    file = source.extractfile(member) if member.isfile() else None
                    member.name = posixpath.join(parent, member.name) if parent else member.name
                    target.addfile(member, file)
    return out.getvalue() if found else b""


def link_member(path: str, stat_header: str | None) -> tarfile.TarInfo | None:
    """The link at ``path`` as its archive's one member, made from the engine's stat of it (the
    header ``X-Docker-Container-Path-Stat``: base64 JSON), where that says ``path`` itself is a
    link; its target is where the engine says the link finally leads (Podman does not say where
    it leads first: a chain of links is one link here). None for anything else, and for a path
    that names what a link leads to (a trailing ``/`` or ``/.``)."""
    name = posixpath.basename(path)
    if not stat_header or name in ("", ".", ".."):
        return None
    try:
        stat = json.loads(base64.b64decode(stat_header))
        mode, target = int(stat.get("mode") or 0), str(stat.get("linkTarget") or "")
    except (ValueError, TypeError, AttributeError):
        return None
    if not mode & MODE_SYMLINK or not target:
        return None
    member = tarfile.TarInfo(name)
    member.type, member.linkname, member.mode = tarfile.SYMTYPE, target, 0o777
    return member


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
