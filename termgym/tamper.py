"""What the agent changed under system paths: the evidence of a verifier that may not be trusted.

On a backend where the agent is root in the file system the verifier then executes (Docker,
Daytona), the agent can replace what the verifier runs: ``/bin/sh``, a shim earlier on ``PATH``,
``/etc/ld.so.preload``, a ``pytest.ini`` or ``conftest.py`` at ``/``. Nothing inside the sandbox can
tell such a change from real work, but the engine can: it knows every path the container changed
against its image. ``system_changes`` picks from those the ones a verifier's tools depend on, and a
run's policy (``EnvOptions.tamper``) decides what they mean: ``warn`` records them, ``fail`` scores
the trial 0 with error kind ``tampered`` without running the verifier. A task whose agent must
change system paths (install a package, configure a service) is graded honestly only in the
separate verification mode (``[verifier].environment_mode = "separate"``).

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

TAMPER_POLICIES = ("warn", "fail")
SYSTEM_PREFIXES = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/etc", "/boot")
# Paths the engine itself writes into every container: its init, and the files it bind-mounts.
ENGINE_PATHS = frozenset({
    "/sbin/docker-init", "/usr/sbin/docker-init", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/etc/mtab",
    "/.dockerenv",
})  # fmt: skip
MAX_LISTED = 50


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


def tamper_warning(paths: list[str]) -> str:
    """One line naming what changed (the first ``MAX_LISTED`` paths, then how many more)."""
    shown = ", ".join(paths[:MAX_LISTED])
    more = f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else ""
    return f"the agent changed {len(paths)} system path(s) the verifier may run: {shown}{more}"
