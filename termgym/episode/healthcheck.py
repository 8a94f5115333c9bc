"""Harbor's ``[environment].healthcheck``: the environment is not handed to the agent until its
command passes, with Docker ``HEALTHCHECK`` semantics.

The first try runs as soon as the sandbox has started, then one every ``start_interval_sec``
during the start period and every ``interval_sec`` after it (measured from the start of the
previous try), each bounded by ``timeout_sec`` (a try that runs out is a
failure). A failure during the first ``start_period_sec`` does not count; after it, ``retries``
consecutive failures (at least one) make the sandbox unhealthy. The first passing try ends the
wait. So an unhealthy verdict comes at the latest after about ``start_period_sec +
max(start_interval_sec, timeout_sec) + retries * max(interval_sec, timeout_sec)`` seconds
(``worst_case_sec``).

``judge`` is the pure schedule; ``wait_healthy`` is its I/O loop, raising ``SandboxError`` (one
line naming the healthcheck's command and its last output line) when the verdict is unhealthy.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from termgym.errors import SandboxError
from termgym.sandboxes.base import Sandbox
from termgym.tasks import Healthcheck

Verdict = Literal["healthy", "unhealthy", "again"]


@dataclass(frozen=True)
class Try:
    """One run of the healthcheck's command: when it started (seconds after the first try) and
    whether it passed."""

    started: float
    passed: bool


def judge(check: Healthcheck, tries: Sequence[Try]) -> Verdict:
    """``healthy`` once the last try passed; ``unhealthy`` once the trailing run of failures that
    started after the start period is ``retries`` long (at least 1); else ``again``."""
    if tries and tries[-1].passed:
        return "healthy"
    counted = 0
    for attempt in reversed(tries):
        if attempt.passed or attempt.started < check.start_period_sec:
            break
        counted += 1
    return "unhealthy" if counted >= max(check.retries, 1) else "again"


def next_try_after(check: Healthcheck, started: float) -> float:
    """Seconds from the start of a failed try (``started`` seconds after the first) to the next:
    ``start_interval_sec`` while that try was inside the start period, else ``interval_sec``."""
    return check.start_interval_sec if started < check.start_period_sec else check.interval_sec


def worst_case_sec(check: Healthcheck) -> float:
    """An upper bound on how long ``wait_healthy`` takes to give up (besides the engine's own delays)."""
    in_start = max(check.start_interval_sec, check.timeout_sec)  # the last try inside the start period
    after = max(check.interval_sec, check.timeout_sec)
    return check.start_period_sec + in_start + after * max(check.retries, 1)


async def wait_healthy(sandbox: Sandbox, check: Healthcheck) -> int:
    """Run the healthcheck until ``judge`` decides; the number of tries when it passed. Raises
    ``SandboxError`` naming the command and its last output line when the sandbox is unhealthy."""
    tries: list[Try] = []
    first = time.monotonic()
    last_line = "no output"
    while True:
        started = time.monotonic()
        result = await sandbox.exec(["/bin/sh", "-c", check.command], timeout=check.timeout_sec)
        passed = result.exit_code == 0 and not result.timed_out
        tries.append(Try(started - first, passed))
        if not passed:
            last_line = _last_line(result.text) if not result.timed_out else f"timed out after {check.timeout_sec:g}s"
        verdict = judge(check, tries)
        if verdict == "healthy":
            return len(tries)
        if verdict == "unhealthy":
            raise SandboxError(
                f"the healthcheck `{check.command}` did not pass after {len(tries)} tries "
                f"({time.monotonic() - first:.0f}s): {last_line}"
            )
        await asyncio.sleep(max(0.0, started + next_try_after(check, started - first) - time.monotonic()))


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else "no output"
