"""The tracer a container runs its verifier under: this host's ``strace`` with the libraries it
needs and its own dynamic loader, as one archive put into each container (``bundle``), run by
that loader so that nothing of the container's is loaded into the tracer (``tracer_argv``).

The loader is told to skip the container's library cache (``--inhibit-cache``) and finds every
library in the bundle; what it still reads from the container is ``/etc/ld.so.preload``, which
the tamper check counts as loaded whatever the trace says (``UNTRACED``). The bundle is made once
per process from the host's files, found through ``ldd``; None where the host has no ``strace``
(the verification then assumes the worst of every change, and says so).
"""

from __future__ import annotations

import functools
import io
import os
import re
import subprocess
import tarfile
from pathlib import Path

from termgym.errors import BackendUnavailable
from termgym.sandboxes.tools import host_tool

UNTRACED = ("/etc/ld.so.preload",)  # read by the tracer's own loader, before any trace
_LDD_LINE = re.compile(r"^\s*(?:(\S+) => )?(/\S+) \(0x[0-9a-f]+\)$")


@functools.cache
def bundle() -> bytes | None:
    """A tar archive of ``strace``, ``ld.so`` and ``lib/*`` (root's, mode 0755), or None."""
    try:
        strace = host_tool("strace")
        ldd = host_tool("ldd")
    except BackendUnavailable:
        return None
    try:
        listed = subprocess.run([ldd, strace], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    loader: str | None = None
    libraries: list[str] = []
    for line in listed.splitlines():
        match = _LDD_LINE.match(line)
        if match is None:
            continue
        if match.group(1) is None and "ld-" in Path(match.group(2)).name:
            loader = match.group(2)
        elif match.group(1) is not None:
            libraries.append(match.group(2))
    if loader is None:
        return None
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, path in [("strace", strace), ("ld.so", loader), *((f"lib/{Path(p).name}", p) for p in libraries)]:
            data = Path(os.path.realpath(path)).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o755, 0, 0
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def tracer_argv(directory: str) -> list[str]:
    """The tracer's command line up to its options, for a bundle unpacked at ``directory``."""
    return [f"{directory}/ld.so", "--inhibit-cache", "--library-path", f"{directory}/lib", f"{directory}/strace"]
