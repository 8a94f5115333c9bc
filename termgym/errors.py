"""The exceptions termgym raises: one tree under ``TermgymError``, each a narrow fault with a
one-line meaning.

Expected outcomes (a command's non-zero exit or timeout, truncated output, a failing verifier) are
data in results, never exceptions. ``AgentDeadline``, the one exception that is no fault, is turned
into data (the ``agent_timeout`` truncation) before it leaves the model agent. Every message is one
line, fit to show a user as it is. The CLI and ``run_trial`` map these and only these:
``ConfigError`` (bad input: one line, exit 2; a trial's ``invalid_task``), any other
``TermgymError`` (a fault: one line, exit 1). Anything else is a bug, not the user's bad input.

    TermgymError
      ConfigError (also a ValueError)   bad input: a flag, an option, a file, a task (TaskError)
        UnknownName                     a name none of those known: the closest ones suggested
      SandboxError                      the sandbox could not be created, used or reached
        BackendUnavailable, EnvironmentBuildError, SandboxGone, SandboxBroken > ShellProtocolError
      EpisodeError                      the environment used out of order
      ModelError                        the agent's model could not be reached or answered unusably
        ContextExceeded                 the next turn does not fit the model's context window
      AgentDeadline                     the episode's agent time ran out during a request
      TrainingError                     the trainer cannot go on (nothing finished, a check failed)"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TermgymError(Exception):
    """Base of every termgym error."""

    kind = "error"


class ConfigError(TermgymError, ValueError):
    """Bad input: a command-line flag, an option, a configuration file, a value out of range. Also
    a ``ValueError``, so that code validating arguments reads as usual."""

    kind = "usage_error"


def did_you_mean(name: str, known: Iterable[str], n: int = 3) -> str:
    """Pure: ``"did you mean A or B?"`` naming up to ``n`` known names close to ``name``, closest
    first (``difflib.get_close_matches``: a similarity ratio of at least 0.6), but none much further
    than the closest (within 0.1 of its ratio: names that share a long prefix, as bundled tasks
    share their family's, are all close to anything under it), or ``""`` when none is close. Every
    place a name is looked up (a bundled task, a family set, a preset, a mode) says it this way."""
    close = difflib.get_close_matches(name, list(known), n=n)
    ratios = [difflib.SequenceMatcher(None, name, candidate).ratio() for candidate in close]
    close = [candidate for candidate, ratio in zip(close, ratios) if ratio >= ratios[0] - 0.1]
    return f"did you mean {' or '.join(close)}?" if close else ""


class UnknownName(ConfigError):
    """A name that is none of those known (a family set, a preset, a mode): one line, the closest
    known names suggested and, for a short list, every one of them."""

    def __init__(self, what: str, name: str, known: Iterable[str]) -> None:
        known = list(known)
        self.name, self.known = name, known
        listed = f"choose one of {', '.join(k or repr(k) for k in known)}"  # an empty name shown as ''
        hint = did_you_mean(name, known)
        super().__init__(f"{what} {name!r}: {f'{hint} ({listed})' if hint else listed}")


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
