"""Host programs a sandbox runs without trusting its own files: each program with the libraries it
needs and its own dynamic loader, as one archive (``bundle``) or one read-only directory
(``kit_dir``), run by that loader (``kit_argv``) so that nothing of the sandbox's root is loaded.

The loader is told to skip the sandbox's library cache (``--inhibit-cache``) and finds every
library in the kit; what it still reads from the sandbox is ``/etc/ld.so.preload``, which the
tamper check counts as loaded whatever the trace says (``UNTRACED``). Docker containers get the
tracer this way (put into each container); the embedded backend's sandboxes that run an image get
the tracer and the programs that enter them (``setpriv``, ``env``, the keeper's ``sh`` and
``sleep``), bound read-only. Made once per process from the host's files, found through ``ldd``;
None where the host lacks one of them.
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import re
import subprocess
import tarfile
import uuid
from collections.abc import Sequence
from pathlib import Path

from termgym.errors import BackendUnavailable
from termgym.sandboxes.tools import host_tool

UNTRACED = ("/etc/ld.so.preload",)  # read by a kit's own loader, before any trace
_LDD_LINE = re.compile(r"^\s*(?:(\S+) => )?(/\S+) \(0x[0-9a-f]+\)$")


@functools.cache
def bundle(programs: tuple[str, ...]) -> bytes | None:
    """A tar archive of each of ``programs`` (by name, found with ``host_tool``), ``ld.so`` and
    ``lib/*`` (root's, mode 0755), or None."""
    try:
        ldd = host_tool("ldd")
        paths = [host_tool(name) for name in programs]
    except BackendUnavailable:
        return None
    loader: str | None = None
    libraries: dict[str, str] = {}
    for path in paths:
        try:
            listed = subprocess.run([ldd, path], capture_output=True, text=True, timeout=30, check=True).stdout
        except (OSError, subprocess.SubprocessError):
            return None
        for line in listed.splitlines():
            match = _LDD_LINE.match(line)
            if match is None:
                continue
            if match.group(1) is None and "ld-" in Path(match.group(2)).name:
                loader = match.group(2)
            elif match.group(1) is not None:
                libraries.setdefault(Path(match.group(2)).name, match.group(2))
    if loader is None:
        return None
    buffer = io.BytesIO()
    members = [*zip(programs, paths), ("ld.so", loader), *((f"lib/{name}", p) for name, p in sorted(libraries.items()))]
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, path in members:
            data = Path(os.path.realpath(path)).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o755, 0, 0
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def kit_argv(directory: str, program: str) -> list[str]:
    """``program`` of the kit at ``directory`` (as the sandbox sees it), run by the kit's loader."""
    return [f"{directory}/ld.so", "--inhibit-cache", "--library-path", f"{directory}/lib", f"{directory}/{program}"]


@functools.cache
def _kit_name(programs: tuple[str, ...]) -> str | None:
    """The kit's directory name: its content's hash (hashed once per process, not per start)."""
    data = bundle(programs)
    return None if data is None else f"kit-{hashlib.sha256(data).hexdigest()[:24]}"


def kit_dir(cache: Path, programs: Sequence[str]) -> Path | None:
    """The kit of ``programs`` unpacked under ``cache`` (this user's, read-only to every other,
    named by its content, so a host upgrade makes a new one); None where ``bundle`` is None."""
    name = _kit_name(tuple(programs))
    if name is None:
        return None
    target = cache / name
    if target.is_dir():
        return target
    data = bundle(tuple(programs))
    assert data is not None  # hashed above
    cache.mkdir(parents=True, exist_ok=True)
    staging = cache / f".kit-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir(mode=0o755)
    (staging / "lib").mkdir(mode=0o755)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:  # ours: regular files named by bundle()
        for member in archive.getmembers():
            source = archive.extractfile(member)
            assert source is not None
            written = staging / member.name
            written.write_bytes(source.read())
            written.chmod(0o755)
    try:
        staging.rename(target)
    except OSError:  # another process made it meanwhile
        subprocess.run([host_tool("rm"), "-rf", "--", str(staging)], check=False)
    return target
