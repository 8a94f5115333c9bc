"""Bounded capture of a command's output: keep the head and the tail, count what was dropped.

Guarantees: memory stays within ``head + tail`` bytes however much is fed; the bytes kept are exactly
the first ``head`` and the last ``tail`` bytes of the stream; decoding never raises (invalid UTF-8
and binary bytes become U+FFFD).
"""

from __future__ import annotations

DEFAULT_OUTPUT_LIMIT = 64 * 1024


class OutputCapture:
    """Keeps the first ``limit // 2`` and last ``limit - limit // 2`` bytes of a byte stream."""

    def __init__(self, limit: int = DEFAULT_OUTPUT_LIMIT) -> None:
        if limit < 2:
            raise ValueError(f"output limit must be at least 2 bytes, got {limit}")
        self._head_limit = limit // 2
        self._tail_limit = limit - self._head_limit
        self._head = bytearray()
        self._tail = bytearray()
        self.total_bytes = 0

    def feed(self, data: bytes) -> None:
        self.total_bytes += len(data)
        room = self._head_limit - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data:
            self._tail += data
            excess = len(self._tail) - self._tail_limit
            if excess > 0:
                del self._tail[:excess]

    @property
    def dropped_bytes(self) -> int:
        return self.total_bytes - len(self._head) - len(self._tail)

    def getvalue(self) -> bytes:
        """The kept bytes, head then tail (without any marker)."""
        return bytes(self._head + self._tail)

    def text(self) -> str:
        """The kept output as text, with a one-line marker where bytes were dropped."""
        head = bytes(self._head).decode("utf-8", errors="replace")
        if not self.dropped_bytes:
            return head + bytes(self._tail).decode("utf-8", errors="replace")
        tail = bytes(self._tail).decode("utf-8", errors="replace")
        return f"{head}\n[... {self.dropped_bytes} bytes of output dropped ...]\n{tail}"
