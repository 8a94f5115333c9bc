"""Small images made here as OCI layouts with umoci from the host's own programs: no registry, no
daemon. dash is ``/bin/sh``; a test adds the programs and files it needs."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

SHELL = ("/usr/bin/dash", "/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2")


def tiny_image(
    root: Path, programs: Sequence[str] = (), files: Mapping[str, str] = {}, *, entrypoint: str | None = None
) -> str:
    """An OCI layout at ``root/layout`` holding one image (``oci:...:1``, readable by every user):
    dash as /bin/sh with its libraries, the host's ``programs`` at their paths, ``files``
    (relative path -> text; executable where it starts with ``#!``) and ``entrypoint``."""
    layout, bundle = root / "layout", root / "bundle"
    subprocess.run(["umoci", "init", "--layout", str(layout)], check=True)
    subprocess.run(["umoci", "new", "--image", f"{layout}:1"], check=True)
    subprocess.run(["umoci", "unpack", "--rootless", "--image", f"{layout}:1", str(bundle)], check=True)
    rootfs = bundle / "rootfs"
    for path in (*SHELL, *programs):
        target = rootfs / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(os.path.realpath(path), target)
    (rootfs / "bin").mkdir()
    (rootfs / "bin" / "sh").symlink_to("/usr/bin/dash")
    for name, text in files.items():
        path = rootfs / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o755 if text.startswith("#!") else 0o644)
    subprocess.run(["umoci", "repack", "--image", f"{layout}:1", str(bundle)], check=True)
    if entrypoint is not None:
        subprocess.run(["umoci", "config", "--image", f"{layout}:1", "--config.entrypoint", entrypoint], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(layout)], check=True)
    return f"oci:{layout}:1"
