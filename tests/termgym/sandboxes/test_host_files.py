"""The verifier's files reached from the host (``termgym.sandboxes.host_files``): whatever the
agent made of the paths (symlinks out of the tree, files in place of directories, FIFOs), nothing
outside the tree is read, written or removed, and what is made belongs to the sandbox's root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from termgym.sandboxes.host_files import HostFiles

OWNER = 12345


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    root.mkdir()
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A host directory the agent would like the harness to empty, or to read reports from."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "precious").write_text("keep me\n")
    (path / "ctrf.json").write_text('{"forged": true}')
    return path


def test_fresh_dirs_replace_symlinks_files_and_trees_without_leaving_the_tree(tree: Path, outside: Path):
    (tree / "logs").symlink_to(outside)  # /logs -> a host directory
    (tree / "tests").write_text("a file where a directory should be")
    (tree / "tmp" / ".termgym-verifier" / "home").mkdir(parents=True)
    (tree / "tmp" / ".termgym-verifier" / "home" / "escape").symlink_to(outside)
    HostFiles(tree, OWNER).fresh_dirs(["/logs/verifier", "/tests", "/tmp/.termgym-verifier/home"])
    assert sorted(p.name for p in outside.iterdir()) == ["ctrf.json", "precious"]
    assert (outside / "precious").read_text() == "keep me\n"
    for path in ("logs", "logs/verifier", "tests", "tmp/.termgym-verifier/home"):
        assert (tree / path).is_dir() and not (tree / path).is_symlink()
    for path in ("logs/verifier", "tests", "tmp/.termgym-verifier/home"):
        assert list((tree / path).iterdir()) == []
        assert (tree / path).stat().st_uid == OWNER


def test_write_files_owns_and_modes_them_and_refuses_paths_out(tree: Path):
    host = HostFiles(tree, OWNER)
    host.fresh_dirs(["/tests"])
    host.write_files("/tests", [("test.sh", b"#!/bin/sh\n", 0o755), ("data/in.txt", b"x", 0o644)])
    script = tree / "tests" / "test.sh"
    assert script.read_bytes() == b"#!/bin/sh\n" and script.stat().st_mode & 0o777 == 0o755
    assert script.stat().st_uid == OWNER and (tree / "tests" / "data").stat().st_uid == OWNER
    assert (tree / "tests" / "data" / "in.txt").stat().st_mode & 0o777 == 0o644
    with pytest.raises(OSError):
        host.write_files("/tests", [("../escape", b"x", 0o644)])
    assert not (tree / "escape").exists()
    with pytest.raises(OSError):  # nothing is overwritten: tests go into a fresh directory
        host.write_files("/tests", [("test.sh", b"again", 0o755)])


def test_reports_are_read_only_from_regular_files_in_the_tree(tree: Path, outside: Path):
    logs = tree / "logs" / "verifier"
    logs.mkdir(parents=True)
    (logs / "results.tap").write_text("1..1\nok 1\n")
    (logs / "ctrf.json").symlink_to(outside / "ctrf.json")  # a forged report from outside
    os.mkfifo(logs / "reward.txt")  # would block a reader that opened it
    (logs / "run.xml").mkdir()
    (logs / "notes.txt").write_text("not a report")
    host = HostFiles(tree, OWNER)
    wanted = lambda name: name.endswith((".tap", ".json", ".txt", ".xml")) and name != "notes.txt"  # noqa: E731
    names = host.list_files("/logs/verifier", wanted)
    assert names == ["results.tap"]
    assert host.read_files("/logs/verifier", ["results.tap", "ctrf.json", "reward.txt"], cap=4) == {
        "results.tap": b"1..1"
    }


def test_a_log_directory_that_is_a_symlink_is_not_read(tree: Path, outside: Path):
    (tree / "logs").mkdir()
    (tree / "logs" / "verifier").symlink_to(outside)
    assert HostFiles(tree, OWNER).list_files("/logs/verifier", lambda name: True) is None
