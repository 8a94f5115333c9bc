"""The changed paths a verifier's tools depend on, picked from what the engine says a container
changed against its image (``Sandbox.changed_system_paths`` on Docker; ``termgym.tamper`` says
what a run makes of them).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

SYSTEM_PREFIXES = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/etc", "/boot")
# Paths the engine itself writes into every container: its init, and the files it bind-mounts.
ENGINE_PATHS = frozenset(
    {
        "/sbin/docker-init",
        "/usr/sbin/docker-init",
        "/etc/hostname",
        "/etc/hosts",
        "/etc/resolv.conf",
        "/etc/mtab",
        "/.dockerenv",
    }
)


def system_changes(changes: Iterable[tuple[str, str]]) -> list[str]:
    """The changed paths that matter to a verifier, sorted, from the engine's ``(path, kind)`` list
    (kind ``A`` added, ``C`` changed, ``D`` deleted): every path under a system prefix and every
    top-level path added or deleted (a file planted at ``/``), without the engine's own paths and
    without directories listed only because something under them changed."""
    listed = {(path.rstrip("/") or "/"): kind for path, kind in changes}
    parents = {path.rsplit("/", 1)[0] or "/" for path in listed}
    picked = []
    for path, kind in listed.items():
        if path in ENGINE_PATHS or path in parents or path == "/":
            continue
        system = any(path == prefix or path.startswith(prefix + "/") for prefix in SYSTEM_PREFIXES)
        top_level = path.count("/") == 1 and kind in ("A", "D")
        if system or top_level:
            picked.append(path)
    return sorted(picked)
