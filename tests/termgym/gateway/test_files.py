"""``termgym gateway --out`` file names (``termgym.gateway.files``): one per session id, never shared
(case ignored too), one path component, readable and read back."""

from __future__ import annotations

import itertools
import unicodedata

import pytest

from termgym.gateway.files import MAX_NAME, session_file_name, session_id_of

IDS = [
    "run-0001",
    "run/0001",
    "run_0001",
    "run%2F0001",
    "Run_0001",
    "RUN_0001",
    ".",
    "..",
    "...",
    "../x",
    "..%2Fx",
    "%2E%2E",
    "%2e%2e",
    ".hidden",
    "a~b",
    "a b",
    "a\x00b",
    "/",
    "\\",
    "ünï/cødé",
    unicodedata.normalize("NFD", "ünï/cødé"),
    "日本語",
    "\U0001f600",
    "lone\udc80surrogate",
    "x" * 195,
    "x" * 196,
    "x" * 300,
    "x" * 301,
    "é" * 300,
    "é" * 301,
    "%" * 100,
]


@pytest.mark.parametrize(
    ("session_id", "name"),
    [
        ("run-0001", "run-0001.json"),
        ("0123abcd.v2_x", "0123abcd.v2_x.json"),
        ("run/0001", "run%2F0001.json"),
        ("run%2F0001", "run%252%460001.json"),
        ("Run", "%52un.json"),
        ("..", "%2E..json"),
        ("ü", "%C3%BC.json"),
    ],
)
def test_names_read_as_the_id(session_id: str, name: str):
    assert session_file_name(session_id) == name
    assert session_id_of(name) == session_id


def test_different_ids_never_share_a_name_even_ignoring_case():
    names = [session_file_name(session_id) for session_id in IDS]
    assert len({name.casefold() for name in names}) == len(IDS)
    for first, second in itertools.combinations(IDS, 2):
        assert session_file_name(first) != session_file_name(second), (first, second)


@pytest.mark.parametrize("session_id", IDS)
def test_every_name_is_one_bounded_component_that_reads_back(session_id: str):
    name = session_file_name(session_id)
    assert name.endswith(".json") and name not in (".", "..") and not name.startswith(".")
    assert "/" not in name and "\x00" not in name and name.isascii()
    assert len(name.encode()) <= MAX_NAME
    if "~" in name:  # a long id: its first characters, then its hash
        assert len(session_id) > 40 and session_id_of(name) is None
        assert name.startswith(session_file_name(session_id[:10])[:-5])
    else:
        assert session_id_of(name) == session_id


def test_a_name_it_never_makes_is_no_id():
    assert session_id_of("run_0001.txt") is None
    assert session_id_of("run%2f0001.json") is None  # lowercase hex: never made
    assert session_id_of("Run.json") is None
    assert session_id_of(".json") is None
    with pytest.raises(ValueError, match="never empty"):
        session_file_name("")
