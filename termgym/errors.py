"""The exceptions termgym raises: one tree under ``TermgymError``, each a narrow fault with a
one-line meaning.

Expected outcomes (a command's non-zero exit, a command timeout, truncated output, a failing
verifier) are data in results, never exceptions. These are for faults of the infrastructure or of
the input. Every message is one line, fit to show a user as it is. The CLI and ``run_trial`` map
these and only these: ``ConfigError`` (bad input: one line, exit 2; a trial's ``invalid_task``),
any other ``TermgymError`` (a fault: one line, exit 1). Anything else is a bug and is not dressed
up as the user's bad input.

    TermgymError
      ConfigError (also a ValueError)   bad input: a flag, an option, a file, a task (TaskError)
      SandboxError                      the sandbox could not be created, used or reached
        BackendUnavailable, EnvironmentBuildError, SandboxGone,
        SandboxBroken > ShellProtocolError
      EpisodeError                      the environment used out of order
      ModelError                        the agent's model could not be reached or answered unusably
      TrainingError                     the trainer cannot go on (nothing finished, a check failed)
"""

from __future__ import annotations


class TermgymError(Exception):
    """Base of every termgym error."""

    kind = "error"


class ConfigError(TermgymError, ValueError):
    """Bad input: a command-line flag, an option, a configuration file, a value out of range. Also
    a ``ValueError``, so that code validating arguments reads as usual."""

    kind = "usage_error"


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
    """The sandbox disappeared while in use (deleted or lost by its provider, killed from outside)."""


class SandboxBroken(SandboxError):
    """The sandbox stopped working from inside: its processes all ended (its init or keeper
    exited), its shell stopped speaking termgym's protocol, or a tool the harness runs in it
    failed. Once the agent has run a command, the trial counts this as the agent's doing
    (``broken_by_agent``, reward 0, never retried); before that, as an infrastructure fault."""


class ShellProtocolError(SandboxBroken):
    """The persistent shell answered something that is not termgym's end-of-command frame."""


class EpisodeError(TermgymError):
    """The environment was used out of order (step before reset, step after the episode ended)."""

    kind = "usage_error"


class ModelError(TermgymError):
    """The agent's model could not be reached, or answered unusably, past the client's retries
    (a trial's ``model_error``: the run goes on)."""

    kind = "model_error"


class TrainingError(TermgymError):
    """The trainer cannot go on: no trajectory finished, no demonstration to learn from, the
    sampler's weights disagree with the trainer's."""

    kind = "training_error"
