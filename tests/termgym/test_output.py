from __future__ import annotations

import pytest

from termgym.output import OutputCapture


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
    with pytest.raises(ValueError):
        OutputCapture(1)
