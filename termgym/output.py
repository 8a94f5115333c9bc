"""Bounded capture of a command's output: keep the head and the tail, count what was dropped; and
``terminal_safe``, which makes untrusted text harmless to print on a terminal.

Guarantees: memory stays within ``head + tail`` bytes however much is fed; the bytes kept are exactly
the first ``head`` and the last ``tail`` bytes of the stream; decoding never raises (invalid UTF-8
and binary bytes become U+FFFD).
"""

from __future__ import annotations

import re

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


# Every alternative starts with ESC and its quantifiers are possessive over classes disjoint from what
# follows them, so no match attempt backtracks: one attempt per ESC, each bounded by the next ESC.
_ESCAPE_SEQUENCE = re.compile(
    r"\x1b(?:"
    r"\[[\x20-\x3f]*+[\x40-\x7e]"  # CSI: parameter and intermediate bytes, then a final byte
    r"|\][^\x07\x1b\x9c]*+(?:\x07|\x1b\\|\x9c)"  # OSC: ends at BEL or ST
    r"|[PX^_][^\x1b\x9c]*+(?:\x1b\\|\x9c)"  # DCS, SOS, PM, APC: end at ST
    r"|[\x20-\x2f]++[\x30-\x7e]"  # nF: intermediate bytes, then a final byte (ESC ( B, ESC # 8)
    r"|[\x30-\x4f\x51-\x57\x59\x5a\x5c\x60-\x7e]"  # two characters: ESC 7, ESC M, ESC c, ESC \ ...
    r")"
)
# C0 controls except tab and newline, DEL, and the C1 controls (ESC and CR among them), removed; lone
# surrogates (what bytes that are not UTF-8 decode to with surrogateescape, as file names do)
# replaced: printed raw they are those bytes (0x9b: an 8-bit CSI), and a strict UTF-8 stream refuses them.
_SURROGATES = dict.fromkeys(range(0xD800, 0xE000), "\ufffd")
_CONTROLS: dict[int, str | None] = {
    **dict.fromkeys([*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0)]),
    **_SURROGATES,
}


def terminal_safe(text: str) -> str:
    """``text`` with nothing a terminal would act on, for printing what a task, a sandbox or a
    verifier wrote.

    Guarantees: every complete escape sequence (CSI, OSC, DCS, SOS, PM, APC, and the ESC-intermediate
    and two-character ones) is removed whole; any remaining ESC is removed alone; carriage returns, the
    other C0 controls but tab and newline, DEL and the C1 controls are removed; every lone surrogate
    becomes U+FFFD; every other character, all printable Unicode included, is kept unchanged and in
    order. So the result holds no character below U+0020 but tab and newline, none from U+007F to
    U+009F, and no surrogate: it always encodes as strict UTF-8. It runs in time linear in
    ``len(text)`` whatever the input (no match attempt backtracks). The result is plain text, not Rich
    markup: print it with ``markup=False`` or as a ``rich.text.Text``.

    Each sequence's exact grammar: docs/security.md#what-every-backend-guarantees-the-verdict
    ("The terminal")."""
    if text.isprintable():  # the common case: nothing to remove
        return text
    return _ESCAPE_SEQUENCE.sub("", text).translate(_CONTROLS)


def plain_text(value: object):
    """``value`` as a ``rich.text.Text`` after ``terminal_safe``: printed as it is (never markup,
    never emoji codes), with nothing a terminal acts on. For text from a task, a sandbox or a verifier."""
    from rich.text import Text

    return Text(terminal_safe(str(value)))


# What display_safe lets through to a terminal: SGR (colours, bold...) and movement within the line
# (cursor forward/back/to a column, erase in line), with plain numeric parameters only.
_DISPLAY_KEPT = re.compile(r"\x1b\[[0-9;:]*+[mKCDG]")
_SGR_RESET = "\x1b[0m"
# display_safe keeps tab, newline, carriage return and backspace (they stay within the line).
_DISPLAY_CONTROLS = {key: value for key, value in _CONTROLS.items() if key not in (0x08, 0x0D)}


def display_safe(text: str) -> str:
    """``text`` as a command printed it, minus whatever would change the user's terminal beyond
    the lines it prints: for showing a command's output on an interactive terminal
    (``termgym shell``). Not for logs or pipes: there, use ``terminal_safe``.

    Guarantees:
    - kept verbatim: every printable character, tab, newline, carriage return and backspace, and
      the CSI sequences ``ESC [ <digits ; :> F`` whose final byte ``F`` is ``m`` (SGR: colours and
      attributes), ``K`` (erase in line), ``C``/``D`` (cursor forward/back) or ``G`` (to a column);
    - removed whole: every other sequence ``terminal_safe`` recognises (OSC text such as a hyperlink's
      stays);
    - removed alone: any other ESC, the other C0 controls, DEL and the C1 controls (so an 8-bit CSI
      ``U+009B`` never reaches the terminal); a lone surrogate becomes U+FFFD;
    - when the last SGR sequence kept is not a reset, the result ends with ``ESC [ 0 m``.
    Linear in ``len(text)``, like ``terminal_safe``. What is removed, by example:
    docs/guides/debugging.md#termgym-shell."""
    if text.isprintable():
        return text
    out: list[str] = []
    position = 0
    styled = False
    for match in _ESCAPE_SEQUENCE.finditer(text):
        out.append(text[position : match.start()].translate(_DISPLAY_CONTROLS))
        sequence = match.group()
        if _DISPLAY_KEPT.fullmatch(sequence):
            out.append(sequence)
            if sequence.endswith("m"):
                styled = sequence not in ("\x1b[m", "\x1b[0m")
        position = match.end()
    out.append(text[position:].translate(_DISPLAY_CONTROLS))
    if styled:
        out.append(_SGR_RESET)
    return "".join(out)
