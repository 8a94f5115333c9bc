"""What the agent changed under system paths: the evidence of a verifier that may not be trusted.

On a backend where the agent is root in the file system the verifier then executes (Docker,
Daytona), the agent can replace what the verifier runs: ``/bin/sh``, a shim earlier on ``PATH``,
``/etc/ld.so.preload``, a ``pytest.ini`` or ``conftest.py`` at ``/``. Nothing inside the sandbox can
tell such a change from real work, but the engine can: it knows every path the container changed
against its image. ``termgym.sandboxes.changes.system_changes`` picks from those the ones a verifier's tools depend on, and a
run's policy (``EnvOptions.tamper``) decides what they mean: ``warn`` records them, ``fail`` scores
the trial 0 with error kind ``tampered`` without running the verifier. A task whose agent must
change system paths (install a package, configure a service) is graded honestly only in the
separate verification mode (``[verifier].environment_mode = "separate"``).

Pure: no I/O.
"""

from __future__ import annotations

TAMPER_POLICIES = ("warn", "fail")
MAX_LISTED = 50


def tamper_warning(paths: list[str]) -> str:
    """One line naming what changed (the first ``MAX_LISTED`` paths, then how many more)."""
    shown = ", ".join(paths[:MAX_LISTED])
    more = f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else ""
    return f"the agent changed {len(paths)} system path(s) the verifier may run: {shown}{more}"
