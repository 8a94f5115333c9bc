"""What ended an episode, as the trial record names it: a sandbox fault (``fault``: the agent's
doing once it has run a command, ``broken_by_agent``, else the infrastructure's ``sandbox_error``)
and what a verification found (``verification_error``), with the stop reason that agrees with it.

Pure: no I/O.
"""

from __future__ import annotations

from termgym.episode.tamper import tamper_warning
from termgym.episode.verification import Verification
from termgym.errors import SandboxBroken, SandboxError
from termgym.records import TrialError
from termgym.tasks import Task
from termgym.transcript import StopReason


def verification_error(verification: Verification, task: Task) -> TrialError | None:
    """The trial's error a verification gives, first match wins: ``tampered``, the verifier's
    timeout, its report's error, a test script that could not run (exit 126 and above)."""
    report = verification.report
    if verification.tampered:
        loaded = tamper_warning(list(verification.forged))
        hint = "scored 0; a task whose verifier runs the agent's work there declares [verifier].agent_paths"
        return {"kind": "tampered", "message": f"{loaded} ({hint})"}
    if verification.timed_out:
        return {"kind": "verifier_timeout", "message": f"verifier exceeded {task.verifier_timeout_sec:g}s"}
    if report.error:
        return {"kind": "verifier_error", "message": report.error}
    if verification.exit_code is not None and verification.exit_code >= 126:
        return {"kind": "verifier_error", "message": f"test script exited {verification.exit_code}"}
    return None


def fault(exc: SandboxError, *, agent_acted: bool) -> TrialError:
    """The trial's error for a sandbox fault: ``broken_by_agent`` when the sandbox stopped working
    from inside after the agent had run a command, else ``sandbox_error`` (the infrastructure's)."""
    if isinstance(exc, SandboxBroken) and agent_acted:
        return {"kind": "broken_by_agent", "message": f"{exc} (after the agent's commands)"}
    return {"kind": "sandbox_error", "message": str(exc)}


def fault_stop_reason(error: TrialError) -> StopReason:
    """The stop reason of an episode a sandbox fault ended: the same as the fault's error kind
    (``broken_by_agent`` or ``sandbox_error``), so the transcript and the record agree."""
    return "broken_by_agent" if error["kind"] == "broken_by_agent" else "sandbox_error"
