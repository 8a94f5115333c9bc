"""The verifier's files reached from the host (``termgym.sandboxes.local.host_files``): whatever the
agent made of the paths (symlinks out of the tree, files in place of directories, FIFOs), nothing
outside the tree is read, written or removed, and what is made belongs to the sandbox's root."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

import pytest

from termgym.sandboxes.local.host_files import LocalHostFiles, overlay_changes

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
    LocalHostFiles(tree, OWNER).fresh_dirs(["/logs/verifier", "/tests", "/tmp/.termgym-verifier/home"])
    assert sorted(p.name for p in outside.iterdir()) == ["ctrf.json", "precious"]
    assert (outside / "precious").read_text() == "keep me\n"
    for path in ("logs", "logs/verifier", "tests", "tmp/.termgym-verifier/home"):
        assert (tree / path).is_dir() and not (tree / path).is_symlink()
    for path in ("logs/verifier", "tests", "tmp/.termgym-verifier/home"):
        assert list((tree / path).iterdir()) == []
        assert (tree / path).stat().st_uid == OWNER


def test_write_files_owns_and_modes_them_and_refuses_paths_out(tree: Path):
    host = LocalHostFiles(tree, OWNER)
    host.fresh_dirs(["/tests"])
    host.write_files("/tests", [("test.sh", b"#!/bin/sh\n", 0o755), ("data/in.txt", b"x", 0o644)])
    script = tree / "tests" / "test.sh"
    assert script.read_bytes() == b"#!/bin/sh\n" and script.stat().st_mode & 0o777 == 0o755
    assert script.stat().st_uid == OWNER and (tree / "tests" / "data").stat().st_uid == OWNER
    assert (tree / "tests" / "data" / "in.txt").stat().st_mode & 0o777 == 0o644
    with pytest.raises(OSError, match=re.escape("not a relative path: ../escape")):
        host.write_files("/tests", [("../escape", b"x", 0o644)])
    assert not (tree / "escape").exists()
    # nothing is overwritten: tests go into a fresh directory
    with pytest.raises(FileExistsError, match=re.escape("'test.sh'")):
        host.write_files("/tests", [("test.sh", b"again", 0o755)])


def test_reports_are_read_only_from_regular_files_in_the_tree(tree: Path, outside: Path):
    logs = tree / "logs" / "verifier"
    logs.mkdir(parents=True)
    (logs / "results.tap").write_text("1..1\nok 1\n")
    (logs / "ctrf.json").symlink_to(outside / "ctrf.json")  # a forged report from outside
    os.mkfifo(logs / "reward.txt")  # would block a reader that opened it
    (logs / "run.xml").mkdir()
    (logs / "notes.txt").write_text("not a report")
    host = LocalHostFiles(tree, OWNER)
    wanted = lambda name: name.endswith((".tap", ".json", ".txt", ".xml")) and name != "notes.txt"  # noqa: E731
    names = host.list_files("/logs/verifier", wanted)
    assert names == ["results.tap"]
    assert host.read_files("/logs/verifier", ["results.tap", "ctrf.json", "reward.txt"], cap=4) == {
        "results.tap": b"1..1"
    }


def test_a_log_directory_that_is_a_symlink_is_not_read(tree: Path, outside: Path):
    (tree / "logs").mkdir()
    (tree / "logs" / "verifier").symlink_to(outside)
    assert LocalHostFiles(tree, OWNER).list_files("/logs/verifier", lambda name: True) is None


def test_a_reset_removes_a_chain_deeper_than_the_recursion_limit(tree: Path):
    from tests.termgym.sandboxes.local.test_host_trees import deep_chain

    (tree / "logs" / "verifier").mkdir(parents=True)
    deep_chain(tree / "logs" / "verifier", 1500)
    LocalHostFiles(tree, OWNER).fresh_dirs(["/logs/verifier"])
    assert list((tree / "logs" / "verifier").iterdir()) == []


def test_an_archive_holds_files_directories_and_links_as_links_within_its_limit(tree: Path, outside: Path):
    import io
    import tarfile

    (tree / "app" / "out").mkdir(parents=True)
    (tree / "app" / "out" / "a.txt").write_text("result")
    (tree / "app" / "out" / "escape").symlink_to(outside)
    (tree / "app" / "top").symlink_to(outside)
    host = LocalHostFiles(tree, OWNER)
    data = host.archive(["/app/out", "/app/top/ctrf.json", "/app/missing"], 1 << 20)
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        found = {m.name: (m.type, m.linkname) for m in archive.getmembers()}
        member = archive.extractfile("app/out/a.txt")
        assert member is not None and member.read() == b"result"
    assert found == {
        "app/out": (tarfile.DIRTYPE, ""),
        "app/out/a.txt": (tarfile.REGTYPE, ""),
        "app/out/escape": (tarfile.SYMTYPE, str(outside)),
    }
    assert host.archive(["/app/missing"], 1 << 20) == b""


def test_an_archive_never_reads_a_file_past_its_limit_not_even_a_sparse_one(tree: Path):
    import time

    (tree / "logs" / "artifacts").mkdir(parents=True)
    with open(tree / "logs" / "artifacts" / "big", "wb") as handle:
        handle.truncate(8 << 40)  # 8 TiB of nothing
    started = time.monotonic()
    with pytest.raises(OSError, match="more than the limit"):
        LocalHostFiles(tree, OWNER).archive(["/logs/artifacts"], 64 << 20)
    assert time.monotonic() - started < 1.0


def test_a_manifest_sees_every_change_even_with_the_times_set_back(tree: Path):
    (tree / "opt" / "venv" / "bin").mkdir(parents=True)
    tool = tree / "opt" / "venv" / "bin" / "pytest"
    tool.write_text("#!/bin/sh\n")
    host = LocalHostFiles(tree, OWNER)
    before = host.manifest(["/opt/venv", "/opt/missing"])
    assert sorted(before) == ["/opt/venv", "/opt/venv/bin", "/opt/venv/bin/pytest"]
    assert host.manifest(["/opt/venv"]) == before
    stat = tool.stat()
    tool.write_text("#!/bin/sx\n")  # the same size, in place
    os.utime(tool, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the modification time put back
    after = host.manifest(["/opt/venv"])
    assert after["/opt/venv/bin/pytest"] != before["/opt/venv/bin/pytest"]


@pytest.mark.skipif(os.geteuid() != 0, reason="a whiteout is a character device: mknod needs root")
def test_overlay_changes_tell_a_whiteout_a_changed_file_and_a_new_tree_of_any_depth(tmp_path):
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    (lower / "opt" / "venv").mkdir(parents=True)
    (lower / "opt" / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (lower / "opt" / "gone").write_text("x")
    (upper / "opt" / "venv").mkdir(parents=True)
    (upper / "opt" / "venv" / "pyvenv.cfg").write_text("home = /tmp/fake\n")
    os.mknod(upper / "opt" / "gone", 0o600 | stat.S_IFCHR, os.makedev(0, 0))
    (upper / "opt" / "new").mkdir()
    fd = os.open(upper / "opt" / "new", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(30):  # past PATH_MAX from the lower directory's own path
            os.mkdir("x" * 200, dir_fd=fd)
            child = os.open("x" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)
    manifest = LocalHostFiles(upper, os.getuid()).manifest(["/opt"])
    changes = overlay_changes(manifest, lower)
    assert changes["/opt/venv/pyvenv.cfg"] == "C" and changes["/opt/gone"] == "D"
    assert changes["/opt/venv"] == "C" and changes["/opt/new"] == "A"
    assert [kind for path, kind in changes.items() if path.endswith("/f")] == ["A"]


def test_the_missing_directories_of_a_working_directory_are_made_and_a_link_in_the_way_is_left(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "srv").symlink_to(outside)  # an image's link, here to a host directory
    files = LocalHostFiles(root, os.getuid())
    files.make_missing_dirs("/work/deep/er")
    assert (root / "work/deep/er").is_dir() and (root / "work/deep/er").stat().st_uid == os.getuid()
    files.make_missing_dirs("/srv/app")
    assert (root / "srv").is_symlink() and not (outside / "app").exists()  # nothing followed
    files.make_missing_dirs("/work/deep/er")  # already there: nothing to do
