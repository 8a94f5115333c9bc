"""Assertion lists the long families share: a file that exists and holds exactly its word."""

from __future__ import annotations

from ..spec import holds_exactly, is_file


def file_holds(path: str, word: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """Two assertions for one written file: it exists; it holds exactly ``word``."""
    return (f"{path} exists", is_file(path)), (f"{path} holds exactly {word}", holds_exactly(path, word))


def listing(paths: list[str]) -> str:
    """``paths`` for an instruction: "a, b and c"."""
    return paths[0] if len(paths) == 1 else ", ".join(paths[:-1]) + " and " + paths[-1]
