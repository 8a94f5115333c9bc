from __future__ import annotations

import time

import pytest

from termgym.output import OutputCapture, terminal_safe


@pytest.mark.parametrize(
    ("limit", "chunks", "kept", "dropped"),
    [
        (10, [b"abc"], b"abc", 0),
        (10, [b"0123456789"], b"0123456789", 0),
        (10, [b"0123456789X"], b"01234" + b"6789X", 1),
        (10, [b"01", b"23", b"45", b"67", b"89", b"AB", b"CD"], b"01234" + b"89ABCD"[-5:], 4),
        (4, [b"x" * 1000, b"yz"], b"xx" + b"yz", 998),
        (2, [b"", b"a", b""], b"a", 0),
    ],
)
def test_head_and_tail_are_kept_exactly(limit, chunks, kept, dropped):
    capture = OutputCapture(limit)
    for chunk in chunks:
        capture.feed(chunk)
    assert capture.getvalue() == kept
    assert capture.dropped_bytes == dropped
    assert capture.total_bytes == sum(map(len, chunks))


def test_text_marks_the_drop_and_never_raises_on_bad_bytes():
    capture = OutputCapture(8)
    capture.feed(b"\xff\xfeabcdefghij\x80")
    text = capture.text()
    assert "bytes of output dropped" in text and "\ufffd" in text


def test_memory_is_bounded_by_the_limit():
    capture = OutputCapture(1024)
    for _ in range(2000):
        capture.feed(b"z" * 4096)
    assert len(capture.getvalue()) == 1024


def test_limit_is_validated():
    with pytest.raises(ValueError, match="output limit must be at least 2 bytes, got 1"):
        OutputCapture(1)


ESC, BEL, ST = "\x1b", "\x07", "\x1b\\"


@pytest.mark.parametrize(
    ("text", "safe"),
    [
        # each kind of escape sequence goes whole
        (f"a{ESC}[2Jb", "ab"),  # CSI: erase the screen
        (f"a{ESC}[1;31mred{ESC}[0mb", "aredb"),  # CSI: colours (SGR)
        (f"a{ESC}[?1049hb", "ab"),  # CSI with a private parameter: alternate screen
        (f"a{ESC}[10;20Hb", "ab"),  # CSI: cursor move
        (f"a{ESC}[ qb", "ab"),  # CSI with an intermediate byte
        (f"a{ESC}]0;pwned{BEL}b", "ab"),  # OSC ended by BEL: window title
        (f"a{ESC}]52;c;cm0gLXJmIH4={BEL}b", "ab"),  # OSC 52: clipboard write
        (f"a{ESC}]8;;https://evil.example/{ST}link{ESC}]8;;{ST}b", "alinkb"),  # OSC ended by ST: hyperlink
        (f"a{ESC}]0;title\x9cb", "ab"),  # OSC ended by the 8-bit ST
        (f"a{ESC}P1$r0m{ST}b", "ab"),  # DCS
        (f"a{ESC}Xstart of string{ST}b", "ab"),  # SOS
        (f"a{ESC}^privacy message{ST}b", "ab"),  # PM
        (f"a{ESC}_application command{ST}b", "ab"),  # APC
        (f"a{ESC}7{ESC}8{ESC}M{ESC}c{ESC}=b", "ab"),  # two-character sequences: save, restore, reverse index, reset
        (f"a{ESC}(B{ESC}#8b", "ab"),  # nF: character set, screen alignment test
        (f"a{ST}b", "ab"),  # a lone ST
        # a sequence cut short loses its ESC, the rest stays as text
        (f"a{ESC}]0;no terminator", "a]0;no terminator"),
        (f"a{ESC}[12", "a[12"),
        (f"a{ESC}Pq", "aPq"),
        (f"a{ESC}", "a"),
        (f"a{ESC}]0;cut{ESC}[2Jb", "a]0;cutb"),  # an OSC interrupted by a CSI
        (f"a{ESC}{ESC}[2Jb", "ab"),
        (f"a{ESC}\x01b", "ab"),
        # 8-bit C1 controls
        ("a\x9b2Jb", "a2Jb"),  # CSI
        ("a\x9d0;t\x07b", "a0;tb"),  # OSC
        ("a\x80\x85\x90\x9c\x9fb", "ab"),
        # carriage returns, backspaces, the other C0 controls, DEL
        ("one\r\ntwo\r\n", "one\ntwo\n"),
        ("progress 10%\rprogress 99%", "progress 10%progress 99%"),
        ("abc\b\b\bxyz", "abcxyz"),
        ("ding\x07\x00\x01\x0b\x0c\x1a\x1f\x7f!", "ding!"),
        # tabs, newlines and printable text, Unicode included, are kept unchanged
        ("col1\tcol2\nline two\n", "col1\tcol2\nline two\n"),
        ("x[/bold] [red]not markup[/] :smile:", "x[/bold] [red]not markup[/] :smile:"),
        ("naïve café · 中文 · 😀 · \u00a0\u00a1\u00ff \u202e", "naïve café · 中文 · 😀 · \u00a0\u00a1\u00ff \u202e"),
        ("", ""),
    ],
)
def test_terminal_safe(text, safe):
    assert terminal_safe(text) == safe


def test_terminal_safe_leaves_no_control_character():
    every = "".join(map(chr, range(0x100))) * 3 + f"{ESC}]{ESC}[{ESC}P{ESC}"
    kept = terminal_safe(every)
    assert not [c for c in kept if (ord(c) < 0x20 and c not in "\t\n") or 0x7F <= ord(c) <= 0x9F]
    assert "\t" in kept and "\n" in kept and "".join(map(chr, range(0xA0, 0x100))) in kept


@pytest.mark.parametrize(
    "hostile",
    [
        f"{ESC}]" * 500_000,  # 1 MB of unterminated OSC introducers
        f"{ESC}]" + "a" * 1_000_000,  # one OSC that never ends
        f"{ESC}]a" * 333_333,
        f"{ESC}P" + "x" * 1_000_000,
        f"{ESC}[" * 500_000,
        f"{ESC}[" + "1;" * 500_000,
        f"{ESC} " * 500_000,
        f"{ESC}" + " " * 1_000_000,
        f"{ESC}" * 1_000_000,
        "\x9d" * 1_000_000,
    ],
)
def test_terminal_safe_is_fast_on_hostile_input(hostile):
    started = time.perf_counter()
    kept = terminal_safe(hostile)
    assert time.perf_counter() - started < 2.0
    assert ESC not in kept and "\x9d" not in kept
