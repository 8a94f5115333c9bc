"""The exceptions termgym raises: one tree under ``TermgymError``, each a narrow fault with a
one-line meaning.

Expected outcomes (a command's non-zero exit, a command timeout, truncated output, a failing
verifier) are data in results, never exceptions. These are for faults of the infrastructure or of
the input; the one exception that is no fault, ``AgentDeadline``, unwinds a request that the
episode's time budget ended, and the model agent turns it into data (the ``agent_timeout``
truncation) before it leaves the agent. Every message is one line, fit to show a user as it is. The CLI and ``run_trial`` map
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
        ContextExceeded                 the next turn does not fit the model's context window
      AgentDeadline                     the episode's agent time ran out during a request
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


class ContextExceeded(ModelError):
    """The prompt (with the reply's token budget) does not fit the model's context window.

    A ``ModelError``: it is the model's side saying no (a server's 400, a client's own count of the
    window), and where nothing can make room (a summary request, the trainer's samplers, the judge)
    the model could not answer: ``model_error``. The episode loop catches it first and applies its
    context policy (``context_exhausted``). ``prompt_tokens``: the prompt's length in tokens when
    the server's message says it, else None."""

    def __init__(self, message: str, prompt_tokens: int | None = None) -> None:
        super().__init__(message)
        self.prompt_tokens = prompt_tokens


class AgentDeadline(TermgymError):
    """The episode's agent time ran out while a request to the model was in flight.

    Not a ``ModelError``: no fault of the model or the server, nothing to retry; the episode's own
    budget ended, and the episode loop records the ``agent_timeout`` truncation. Not a
    ``TimeoutError``: a request's own timeout is a ``ModelError``, and the two must not be caught
    as one."""

    kind = "agent_timeout"


class TrainingError(TermgymError):
    """The trainer cannot go on: no trajectory finished, no demonstration to learn from, the
    sampler's weights disagree with the trainer's."""

    kind = "training_error"
