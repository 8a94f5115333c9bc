"""Trees the agent made, walked and removed from the host (``termgym.sandboxes.local.host_trees``): any
depth without recursion, bounded in entries, never following a symlink out of the tree."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from termgym.sandboxes.local.host_trees import MAX_OPEN_DEPTH, TreeTooLarge, remove_path, remove_tree, walk


def deep_chain(root: Path, depth: int) -> None:
    """``root/d/d/.../d`` ``depth`` levels deep (deeper than a path may be written), a file every 100 levels."""
    fd = os.open(root, os.O_RDONLY)
    try:
        for level in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
            if level % 100 == 0:
                os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)


def test_a_chain_deeper_than_the_recursion_limit_is_removed_holding_few_descriptors(tmp_path: Path):
    (tmp_path / "tree").mkdir()
    deep_chain(tmp_path / "tree", 3 * sys.getrecursionlimit())
    before = len(os.listdir("/proc/self/fd"))
    parent = os.open(tmp_path, os.O_RDONLY)
    try:
        remove_tree(parent, "tree")
    finally:
        os.close(parent)
    assert not (tmp_path / "tree").exists()
    assert len(os.listdir("/proc/self/fd")) == before  # every descriptor it opened is closed
    assert MAX_OPEN_DEPTH < 100


def test_removal_stops_past_its_bound_and_never_follows_a_symlink(tmp_path: Path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("keep")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "link").symlink_to(outside)
    for i in range(50):
        (tree / f"f{i}").touch()
    parent = os.open(tmp_path, os.O_RDONLY)
    try:
        with pytest.raises(TreeTooLarge):
            remove_tree(parent, "tree", limit=10)
        remove_tree(parent, "tree")
    finally:
        os.close(parent)
    assert not tree.exists() and (outside / "precious").read_text() == "keep"
    assert remove_path(tmp_path / "missing") and remove_path(outside) and not outside.exists()


def test_walk_lists_every_entry_once_without_following_links_and_within_its_bounds(tmp_path: Path):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "f").write_text("x")
    (tmp_path / "l").symlink_to("/etc")
    top = os.open(tmp_path, os.O_RDONLY)
    try:
        assert sorted(path for path, *_ in walk(top, max_entries=10, max_depth=5)) == ["a", "a/b", "a/f", "l"]
        with pytest.raises(TreeTooLarge):
            list(walk(top, max_entries=3, max_depth=5))
        with pytest.raises(TreeTooLarge):
            list(walk(top, max_entries=10, max_depth=1))
    finally:
        os.close(top)
