"""The exceptions termgym raises: one flat tree, each a narrow fault with a one-line meaning.

Expected outcomes (a command's non-zero exit, a command timeout, truncated output, a failing
verifier) are data in results, never exceptions. These are for faults of the infrastructure or of
the input. Every message is one line, fit to show a user as it is.
"""

from __future__ import annotations


class TermgymError(Exception):
    """Base of every termgym error."""

    kind = "error"


class SandboxError(TermgymError):
    """The sandbox could not be created, used or reached (an infrastructure fault)."""

    kind = "sandbox_error"


class BackendUnavailable(SandboxError):
    """The backend's requirements are missing on this machine (a binary, a daemon, credentials)."""


class EnvironmentBuildError(SandboxError):
    """The task's environment could not be built or prepared; retrying will not help."""

    kind = "build_failed"

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log


class SandboxGone(SandboxError):
    """The sandbox disappeared while in use (killed from outside, crashed, deleted)."""


class EpisodeError(TermgymError):
    """The environment was used out of order (step before reset, step after the episode ended)."""

    kind = "usage_error"
