"""What the agent changed under system paths: the evidence of a verifier that may not be trusted.

On a backend where the agent is root in the file system the verifier then executes (Docker,
Daytona), the agent can replace what the verifier runs: ``/bin/sh``, a shim earlier on ``PATH``,
``/etc/ld.so.preload``, a ``pytest.ini`` or ``conftest.py`` at ``/``; on every backend, what a task's
``[verifier].env`` puts on a search path from the writable directories. Nothing inside the sandbox
can tell such a change from real work, but the engine can (it knows every path the container
changed against its image), and so can the host for the embedded backend's watched paths (their
change times). ``termgym.sandboxes.changes.system_changes`` picks the ones a verifier's tools depend
on, and a run's policy (``EnvOptions.tamper``) decides what they mean: ``fail``, the default, scores
the trial 0 with error kind ``tampered`` without running the verifier; ``warn`` records them and
verifies. A task whose agent must change system paths (install a package, configure a service)
declares ``[verifier].allow_system_changes``: its changes are recorded, neither warned about nor
failed; it is graded against a determined agent only in the separate verification mode
(``[verifier].environment_mode = "separate"``).

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
