"""Pulling images from a registry for the Docker backend, under a pull policy.

The policy (``--pull``) is one of ``missing`` (pull only what the engine lacks, as ``docker run``
does), ``never`` (an absent image is an error) and ``always`` (pull every ref once per process,
the first time a trial needs it; later trials of the process use that pull). Pure parts:
``pull_needed`` (the decision), ``PullProgress`` (a pull's JSON stream summed to one line),
``pull_error`` (the one line an error becomes). ``ensure_pulled`` does the I/O with a docker-py
client, one lock per ref so that concurrent trials pull an image once.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from termgym.errors import EnvironmentBuildError

PULL_POLICIES = ("missing", "never", "always")

_LAYER = re.compile(r"[0-9a-f]{12}")  # a layer's short id, as pull streams name layers
_pull_locks: dict[str, asyncio.Lock] = {}
_pulled: set[str] = set()  # refs pulled by this process (policy "always" pulls each once)


def pull_needed(policy: str, present: bool, pulled_before: bool) -> bool:
    """Whether to pull a ref: ``missing`` when absent, ``always`` unless this process pulled it
    already, ``never`` not at all (an absent image is then the caller's error)."""
    if policy == "never":
        return False
    if policy == "always":
        return not pulled_before
    return not present


def absent_error(ref: str, what: str) -> EnvironmentBuildError:
    """The one line for an image that ``--pull never`` leaves absent."""
    return EnvironmentBuildError(
        f"{what}: image {ref} is not present and --pull never forbids pulling it; "
        f"pull or build it first, or use a local image (--image-alias {ref}=LOCAL)"
    )


def pull_error(ref: str, what: str, reason: str) -> EnvironmentBuildError:
    """The one line a failed pull becomes: which image, the engine's reason (on one line, cut to
    300 characters) and the two ways out."""
    reason = " ".join(reason.split())[:300] or "pull failed"
    return EnvironmentBuildError(
        f"{what}: could not pull image {ref}: {reason}; use a local image (--image-alias {ref}=LOCAL) or --pull never"
    )


@dataclass
class PullProgress:
    """A pull's JSON stream (``{"id", "status", "progressDetail"}`` per layer) summed to one line:
    ``pulling REF: N/M layers, X/Y MB``. ``feed`` returns the error a chunk carries, if any."""

    ref: str
    layers: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (current, total) bytes
    done: set[str] = field(default_factory=set)

    def feed(self, chunk: dict[str, Any]) -> str | None:
        if chunk.get("error"):
            return str(chunk.get("error"))
        layer, status = chunk.get("id"), str(chunk.get("status") or "")
        if not isinstance(layer, str) or not _LAYER.fullmatch(layer):
            return None  # a status line for the image as a whole (its tag, its digest)
        detail = chunk.get("progressDetail") or {}
        if status.startswith("Downloading") and detail.get("total"):
            self.layers[layer] = (int(detail.get("current") or 0), int(detail["total"]))
        elif status in ("Download complete", "Pull complete", "Already exists"):
            self.done.add(layer)
            current, total = self.layers.get(layer, (0, 0))
            self.layers[layer] = (total or current, total or current)
        else:
            self.layers.setdefault(layer, (0, 0))
        return None

    def line(self) -> str:
        current = sum(c for c, _ in self.layers.values()) / 1e6
        total = sum(t for _, t in self.layers.values()) / 1e6
        return f"pulling {self.ref}: {len(self.done)}/{len(self.layers)} layers, {current:.1f}/{total:.1f} MB"


def stderr_reporter(ref: str, stream: TextIO | None = None) -> Callable[[str | None], None]:
    """A progress callback for ``pull_image``: on a terminal one line rewritten in place (cleared
    at the end, ``None``); elsewhere one line when the pull begins and nothing more."""
    out = stream or sys.stderr
    tty = out.isatty()
    state = {"started": False, "last": 0.0}

    def report(line: str | None) -> None:
        if line is None:
            if tty and state["started"]:
                out.write("\r\x1b[K")
                out.flush()
            return
        if not tty:
            if not state["started"]:
                out.write(f"termgym: pulling {ref}\n")
                out.flush()
            state["started"] = True
            return
        now = time.monotonic()
        if now - state["last"] >= 0.2:
            out.write(f"\r\x1b[K{line}")
            out.flush()
            state["last"], state["started"] = now, True

    return report


def pull_image(client: Any, ref: str, what: str, report: Callable[[str | None], None]) -> None:
    """Pull ``ref`` through docker-py, reporting a progress line as the stream goes; a registry
    that cannot be reached, an image that does not exist and a refused login all raise
    ``EnvironmentBuildError`` in one line (``pull_error``). Blocking."""
    import docker.errors

    progress = PullProgress(ref)
    report(progress.line())
    try:
        for chunk in client.api.pull(ref, stream=True, decode=True):
            error = progress.feed(chunk)
            if error is not None:
                raise pull_error(ref, what, error)
            report(progress.line())
    except docker.errors.APIError as exc:
        raise pull_error(ref, what, str(exc.explanation or exc)) from None
    except docker.errors.DockerException as exc:
        raise pull_error(ref, what, str(exc)) from None
    finally:
        report(None)


async def ensure_pulled(
    client: Any,
    ref: str,
    *,
    policy: str,
    what: str,
    present: Callable[[Any, str], bool],
    run: Callable,
    reporter: Callable[[str], Callable[[str | None], None]] = stderr_reporter,
) -> None:
    """Make ``ref`` present per ``policy`` (``pull_needed``), one pull at a time per ref in this
    process; afterwards the image is present or ``EnvironmentBuildError`` was raised.
    ``present(client, ref)`` and the pull run through ``run(fn, *args)``, off the loop."""
    lock = _pull_locks.setdefault(ref, asyncio.Lock())
    async with lock:
        is_present = await run(present, client, ref)
        if pull_needed(policy, is_present, ref in _pulled):
            await run(pull_image, client, ref, what, reporter(ref))
            _pulled.add(ref)
            is_present = await run(present, client, ref)
            if not is_present:
                raise pull_error(ref, what, "the engine reports the pull done but has no such image")
        if not is_present:
            raise absent_error(ref, what)
