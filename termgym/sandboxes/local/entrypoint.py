"""An image's ``ENTRYPOINT`` in an embedded sandbox, run as Docker runs it on every (re)start of a
container whose command is the backend's keeper: ``ENTRYPOINT... KEEPER``, so an entrypoint that
starts services and then runs ``"$@"`` has them up before the agent's first command, and again at
the end of each kill step (which ends them), as a container's restart does: before the agent's
changes are listed and the verifier runs, so whatever the entrypoint changes is listed too.

Guaranteed: ``run_entrypoint`` returns once the entrypoint ran its command (``"$@"``, a ``sleep``
that marks it), or it exited, or ``READY_TIMEOUT`` passed, with one warning line for the last two;
the entrypoint's processes live in the sandbox's PID namespace and end with it (the kill step,
``stop``). Its output goes to ``entrypoint.log`` in the sandbox's host directory. Pure part:
``ready_in``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from termgym.sandboxes.host_processes import alive, descendants, end_entered, spawn

READY_TIMEOUT = 30.0  # seconds an entrypoint has to run its command
MARK = "0.00002718281828"  # the command's last word: the sleep that shows "$@" ran
POLL_SEC = 0.005


def marked_command(sleep: Sequence[str]) -> list[str]:
    """The command given to the entrypoint: ``sleep`` (the kit's, over an image) for ever, its last
    word the mark (GNU sleep sums its operands: ``infinity`` plus the mark's few microseconds)."""
    return [*sleep, "infinity", MARK]


def ready_in(command_lines: Mapping[int, bytes], command: Sequence[str]) -> bool:
    """Whether one of the processes (pid -> its /proc cmdline) runs exactly ``command`` (the
    entrypoint's own process holds it too, as its arguments, until it runs it)."""
    line = "\0".join(command).encode() + b"\0"
    return any(found == line for found in command_lines.values())


def _command_lines(pids: Sequence[int]) -> dict[int, bytes]:
    lines = {}
    for pid in pids:
        try:
            lines[pid] = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
    return lines


async def run_entrypoint(
    entrypoint: Sequence[str], sleep: Sequence[str], enter: Callable[[list[str]], list[str]], log: Path
) -> tuple[asyncio.subprocess.Process, str | None]:
    """Start ``entrypoint`` with the marked command (``enter`` makes the host command line that runs
    it in the sandbox) and wait until it runs that command: the started host process (end it with
    ``end_entered``), and a warning where it exited first or took longer than ``READY_TIMEOUT``."""
    command = marked_command(sleep)
    with log.open("ab") as output:
        process = await spawn(
            enter([*entrypoint, *command]),
            end_entered,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=True,
        )
    shown = " ".join(entrypoint)[:200]
    deadline = time.monotonic() + READY_TIMEOUT
    while not ready_in(_command_lines(descendants(process.pid)), command):
        if process.returncode is not None or not alive(process.pid):
            await end_entered(process)
            return process, f"the image's entrypoint ({shown}) exited ({process.returncode}) before running its command"
        if time.monotonic() > deadline:
            return process, f"the image's entrypoint ({shown}) did not run its command within {READY_TIMEOUT:g}s"
        await asyncio.sleep(POLL_SEC)
    return process, None
