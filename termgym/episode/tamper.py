"""What a run makes of a verifier that loaded files the agent wrote (``termgym.episode.guard``).

Every step that runs in the sandbox after the agent's end is traced; a load of a file the agent
added or changed outside its work (the work directory, ``[verifier].agent_paths``) is a forged
load. A run's policy (``EnvOptions.tamper``) decides what it means: ``fail``, the default, scores
the trial 0 with error kind ``tampered`` and names the files; ``warn`` keeps the verifier's verdict
and records them as a warning. A task whose verifier runs the agent's work outside the work
directory declares where (``[verifier].agent_paths``), or that it trusts every change
(``[verifier].allow_system_changes``); it is graded against a determined agent only in the separate
verification mode (``[verifier].environment_mode = "separate"``).

Pure: no I/O.
"""

from __future__ import annotations

TAMPER_POLICIES = ("warn", "fail")
MAX_LISTED = 20


def tamper_warning(forged: list[str]) -> str:
    """One line naming the forged loads (the first ``MAX_LISTED``, then how many more)."""
    shown = "; ".join(forged[:MAX_LISTED])
    more = f"; and {len(forged) - MAX_LISTED} more" if len(forged) > MAX_LISTED else ""
    return f"the verifier loaded {len(forged)} file(s) the agent wrote outside its work: {shown}{more}"
