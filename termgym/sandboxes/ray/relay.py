"""A process channel's output across the Ray boundary, in as few calls as a step allows.

Every actor call costs a round trip of a millisecond or so, most of it CPU on both sides, so a
persistent-shell step must not take more than one. On the node, ``OutputRelay`` reads the process's
output continuously into a bounded buffer. The driver takes it in numbered batches two ways:

- ``read``, a long poll the driver keeps outstanding: the next batch, once there is output and no
  exchange is holding it;
- ``exchange(data, end)``: write ``data``, then hold the output until ``end`` appears in it (the
  shell's end-of-command line), the process's output closes, ``BATCH_BYTES`` are held, or
  ``HOLD_SEC`` pass; then return it as one batch. A step is then one call and its reply; the poll
  stays outstanding, untouched.

Batches carry consecutive numbers (a batch is taken only when it holds bytes or the end of the
output), and the driver's ``Batches`` hands them on in that order whatever order the replies come
back in. Memory stays bounded: the node stops reading the process once ``BUFFER_BYTES`` wait.
"""

from __future__ import annotations

import asyncio
import contextlib

from termgym.aio import cancel_and_wait, wait_for
from termgym.sandboxes.base import ProcessChannel

BATCH_BYTES = 1 << 16  # at most this much per batch
BUFFER_BYTES = 1 << 20  # the node reads no more while this much waits for the driver
HOLD_SEC = 0.25  # an exchange hands over what it has after this long; the poll takes the rest


# One batch of output, ``(seq, data, eof)``: ``seq`` counts from 0; ``eof``, the output has ended (so
# says every batch from then on). A plain tuple: a dataclass costs Ray about 0.05 ms more a call.
Batch = tuple[int, bytes, bool]


class OutputRelay:
    """The node's side: a process channel's output, buffered and handed out as ``Batch``es."""

    def __init__(self, channel: ProcessChannel) -> None:
        self.channel = channel
        self._buffer = bytearray()
        self._eof = False
        self._error: BaseException | None = None
        self._holding = 0  # exchanges in progress: the poll waits while any holds the output
        self._seq = 0
        self._changed = asyncio.Condition()
        self._pump = asyncio.create_task(self._read_all())

    async def _read_all(self) -> None:
        try:
            while True:
                async with self._changed:
                    await self._changed.wait_for(lambda: len(self._buffer) < BUFFER_BYTES)
                data = await self.channel.read(BATCH_BYTES)
                async with self._changed:
                    if data:
                        self._buffer += data
                    else:
                        self._eof = True
                    self._changed.notify_all()
                if not data:
                    return
        except Exception as exc:  # the channel's fault, raised to whoever takes output next
            async with self._changed:
                self._error = exc
                self._changed.notify_all()

    def _take(self) -> Batch | None:
        """The buffered output as the next batch, or None when there is nothing to hand over."""
        if self._error is not None and not self._buffer:
            raise self._error
        data = bytes(self._buffer[:BATCH_BYTES])
        del self._buffer[:BATCH_BYTES]
        eof = self._eof and not self._buffer
        if not data and not eof:
            return None
        batch = (self._seq, data, eof)
        self._seq += 1
        self._changed.notify_all()  # room in the buffer again
        return batch

    def _ready(self) -> bool:
        return bool(self._buffer) or self._eof or self._error is not None

    async def read(self) -> Batch:
        """The next batch once there is output (or its end) and no exchange holds it."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._ready() and not self._holding)
            batch = self._take()
        assert batch is not None
        return batch

    async def exchange(self, data: bytes, end: bytes) -> Batch | None:
        """Write ``data``, then the output until ``end`` appears in it (or the module's other
        limits); None if nothing came (the poll then takes what comes later)."""
        async with self._changed:
            self._holding += 1
            searched = max(0, len(self._buffer) - len(end))
        try:
            await self.channel.write(data)

            def complete() -> bool:
                held = self._buffer
                return end in held[searched:] or len(held) >= BATCH_BYTES or self._eof or self._error is not None

            async with self._changed:
                with contextlib.suppress(TimeoutError):
                    await wait_for(self._changed.wait_for(complete), HOLD_SEC)
                return self._take()
        finally:
            async with self._changed:
                self._holding -= 1
                self._changed.notify_all()

    async def close(self) -> None:
        """Stop reading and close the channel; a call still waiting gets the output's end."""
        await cancel_and_wait(self._pump)
        async with self._changed:
            self._eof = True
            self._changed.notify_all()
        await self.channel.close()


class Batches:
    """The driver's side: batches in any order in, bytes in ``seq`` order out."""

    def __init__(self) -> None:
        self._next = 0
        self._early: dict[int, tuple[bytes, bool]] = {}
        self._ready = bytearray()
        self.eof = False

    def add(self, batch: Batch | None) -> None:
        if batch is None:
            return
        seq, data, eof = batch
        self._early[seq] = (data, eof)
        while self._next in self._early:
            data, eof = self._early.pop(self._next)
            self._ready += data
            self.eof = self.eof or eof
            self._next += 1

    def take(self, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` of the bytes ready, in order (``b""`` when none are)."""
        data = bytes(self._ready[:max_bytes])
        del self._ready[:max_bytes]
        return data

    def __bool__(self) -> bool:
        return bool(self._ready)
