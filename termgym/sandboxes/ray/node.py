"""One node of a Ray cluster as the driver sees it: its actor, capacity and load (``ClusterNode``),
the task files shipped to it once per content hash (``pack_files``), and every call on its actor
with Ray's faults mapped (``remote``): an exception the actor raised comes back as itself (a
``SandboxError`` stays one); a failure of Ray itself (the actor or node gone, an actor its node can no
longer schedule) is ``SandboxGone`` and marks the node down."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from termgym.errors import SandboxGone
from termgym.sandboxes.base import SandboxSpec


@dataclass
class ClusterNode:
    """One Ray node: its name in records (``ray-<address>-<id>``), its capacity and its actor."""

    node_id: str
    address: str
    cpus: float
    cap: int
    backend: str
    actor: Any = None
    down: bool = False
    busy: int = 0
    _shipped: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return f"ray-{self.address}-{self.node_id[:8]}"

    async def ship(self, spec: SandboxSpec) -> str | None:
        """Make the spec's files present on the node (once per content hash); their hash, or None
        for a spec without files (an image by name)."""
        packed = pack_files(spec)
        if packed is None:
            return None
        digest, archive = packed
        if digest in self._shipped:
            return digest
        if not await remote(self, self.actor.has_files.remote(digest)):
            await remote(self, self.actor.put_files.remote(digest, archive))
        self._shipped.add(digest)
        return digest


_packed: dict[tuple[str, ...], tuple[str, bytes]] = {}


def forget_packed() -> None:
    """Pack the task files again from now on (a run's end: the tasks may change before the next)."""
    _packed.clear()


def pack_files(spec: SandboxSpec) -> tuple[str, bytes] | None:
    """The spec's build context (``context/``), Dockerfile and compose file as one tar, and its
    content hash (names, modes and bytes; not times or owners). Packed once per set of paths."""
    paths = (spec.context_dir, spec.dockerfile, spec.compose_file)
    if all(path is None for path in paths):
        return None
    key = tuple(str(path) for path in paths)
    if key not in _packed:
        _packed[key] = _pack(*paths)
    return _packed[key]


def _pack(context: Path | None, dockerfile: Path | None, compose: Path | None) -> tuple[str, bytes]:
    entries: list[tuple[str, Path]] = []
    if context is not None and context.is_dir():
        entries += [(f"context/{p.relative_to(context).as_posix()}", p) for p in sorted(context.rglob("*"))]
    for name, path in (("Dockerfile", dockerfile), ("compose.yaml", compose)):
        if path is not None and path.is_file():
            entries.append((name, path))
    buffer, digest = io.BytesIO(), hashlib.sha256()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, path in entries:
            info = archive.gettarinfo(str(path), arcname=name)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            digest.update(f"{name}\0{info.mode}\0{info.type!r}\0{info.linkname}\0".encode())
            if info.isfile():
                data = path.read_bytes()
                digest.update(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                archive.addfile(info)
    return digest.hexdigest()[:32], buffer.getvalue()


async def remote(node: ClusterNode, call: Awaitable[Any]) -> Any:
    """The result of a call on ``node``'s actor, with the faults mapped as the module docstring says."""
    import ray.exceptions

    try:
        return await call
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, Exception) and not isinstance(cause, ray.exceptions.RayError):
            raise cause from None  # what the sandbox itself raised, a SandboxError among them
        node.down = True
        raise SandboxGone(f"node {node.name}: {first_line(exc)}") from None
    except ray.exceptions.RayError as exc:  # the actor or its node is gone, or never came up there
        node.down = True
        raise SandboxGone(f"node {node.name} is gone: {first_line(exc)}") from None


def first_line(exc: BaseException) -> str:
    """An exception's first line that is not blank, cut at 300 characters (its type's name when none is)."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0][:300] if lines else type(exc).__name__
