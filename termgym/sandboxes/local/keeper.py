"""A sandbox's keeper: the one long-lived process whose namespaces every command enters, and its
spare, a second keeper started with the sandbox that no command ever enters until it takes over.

Guarantees: ``stop`` ends the keeper's whole PID namespace (the kernel kills every process of a
namespace when its first process dies) and, for a kept sandbox, the detached bubblewrap; the
spare, while not handed over, belongs to the ``Keeper`` (``discard_spare``, which ``stop``'s
callers run, ends it), so a cancellation never leaves one running unowned; ``pid`` is the keeper's
host pid while it runs, and None once it is stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from termgym.aio import wait_for
from termgym.errors import SandboxError
from termgym.sandboxes.host_processes import (
    alive,
    children,
    close_output_pipes,
    end_detached,
    end_keeper,
    read_stderr,
    spawn,
    start_detached,
    start_time,
)
from termgym.sandboxes.local.host import keeper_is_init

START_TIMEOUT = 10.0
Started = tuple[asyncio.subprocess.Process, int]  # the keeper's bubblewrap on the host, the keeper's host pid


def keeper_of(bwrap: int) -> int:
    """The keeper command's host pid under its bubblewrap ``bwrap``: that one's child, the PID
    namespace's init (``host.keeper_is_init``), else the child of bubblewrap's own init, its reaper.
    ``ValueError`` unless there is exactly one."""
    (init,) = children(bwrap)
    if keeper_is_init():
        return init
    (keeper,) = children(init)
    return keeper


class Keeper:
    """The keeper of one sandbox, started from ``argv(detached)`` (bubblewrap's command line);
    ``pid_file`` gets the pid of the bubblewrap that holds the namespace (for garbage collection)."""

    def __init__(self, argv: Callable[[bool], list[str]], pid_file: Path) -> None:
        self._argv = argv
        self._pid_file = pid_file
        self.process: asyncio.subprocess.Process | None = None
        self.pid: int | None = None  # host pid of the namespace's keeper command
        self.detached: tuple[int, int | None] | None = None  # a kept keeper's bwrap: (pid, start time)
        self._spare: asyncio.Future[Started] | None = None

    async def start(self) -> None:
        """Start a keeper (the sandbox's first, or a new one after every process was ended)."""
        self.process, self.pid = await self._spawn()
        self._pid_file.write_text(str(self.process.pid))

    async def _spawn(self) -> Started:
        """A new keeper, its namespaces set up."""
        process = await spawn(
            self._argv(False),
            end_keeper,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # out of the terminal's process group: Ctrl-C is termgym's to handle
        )
        assert process.stdout is not None and process.stderr is not None
        try:
            line = await wait_for(process.stdout.readline(), START_TIMEOUT)
            if line != b"ready\n":
                raise ValueError("the keeper did not start")
            keeper = keeper_of(process.pid)
            close_output_pipes(process)  # the keeper says nothing more (its command sleeps)
        except (TimeoutError, ValueError) as exc:
            await end_keeper(process)
            stderr = (await read_stderr(process)).strip() or str(exc)
            raise SandboxError(f"bubblewrap failed to start a sandbox: {stderr}") from exc
        except BaseException:
            await end_keeper(process)
            raise
        return process, keeper

    # -- the spare: a clean namespace ready for the verifier ---------------------------------------

    def start_spare(self) -> None:
        """Start a second keeper in the background, which no command ever enters until it takes
        over: the kill step then ends the first one's whole namespace and goes on at once in a
        namespace the agent never reached (no keeper to start on the verifier's path)."""
        self._spare = asyncio.ensure_future(self._spawn())

    async def take_spare(self) -> Started | None:
        """The spare keeper (waited for if it is still starting), alive; None if there is none.
        It stays the spare until ``hand_over``, so that a cancellation before then leaves it to
        ``discard_spare`` rather than running unowned."""
        spare = self._spare
        if spare is None:
            return None
        try:
            process, keeper = await asyncio.shield(spare)
        except (SandboxError, OSError):
            self._spare = None
            return None
        if not alive(keeper):
            await self.discard_spare()
            return None
        return process, keeper

    def hand_over(self, spare: Started) -> None:
        """The spare is the keeper from here on (the old one was stopped)."""
        self.process, self.pid = spare
        self._spare = None
        self._pid_file.write_text(str(spare[0].pid))

    async def discard_spare(self) -> None:
        spare, self._spare = self._spare, None
        if spare is None:
            return
        if not spare.done():
            spare.cancel()
        try:
            process, _ = await spare
        except (asyncio.CancelledError, SandboxError, OSError):
            return
        await end_keeper(process)

    # -- stopping, and running past this process ---------------------------------------------------

    async def stop(self, *, on_detached_end: Callable[[], None] | None = None) -> None:
        """End the keeper (its whole namespace), or the detached one of a kept sandbox
        (``on_detached_end`` runs then: the sandbox is no longer kept)."""
        if self.process is not None:
            await end_keeper(self.process)
        elif self.detached is not None:
            await asyncio.to_thread(end_detached, *self.detached)
            if on_detached_end is not None:
                on_detached_end()
        self.pid = None
        self.process = None
        self.detached = None

    async def start_detached(self, log: Path) -> None:
        """Start a keeper that outlives this process (no ``--die-with-parent``, a session of its
        own, no child of this process); ``SandboxError`` when its namespace does not start."""
        pid = await asyncio.to_thread(start_detached, self._argv(True), log=log, timeout=START_TIMEOUT)
        self.detached = (pid, start_time(pid))
        try:
            keeper = keeper_of(pid)
        except ValueError as exc:
            await self.stop()
            raise SandboxError("the kept sandbox's keeper did not start its namespace") from exc
        self.pid = keeper
        self._pid_file.write_text(str(pid))

    def attach(self, detached: tuple[int, int | None], pid: int) -> None:
        """Take over the detached keeper a kept sandbox left running."""
        self.detached, self.pid = detached, pid
