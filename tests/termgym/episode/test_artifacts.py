"""What may cross from the agent's sandbox into a separate verifier's (termgym.episode.artifacts)."""

from __future__ import annotations

import io
import subprocess
import tarfile

import pytest

from termgym.episode.artifacts import artifact_paths, safe_artifacts


def archive(*members: tuple[str, bytes | None, str, int]) -> bytes:
    """(name, content or None for a directory, kind, mode), kind one of file, dir, symlink, link, fifo."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content, kind, mode in members:
            info = tarfile.TarInfo(name)
            info.mode, info.uid = mode, 1234
            info.type = {
                "file": tarfile.REGTYPE,
                "dir": tarfile.DIRTYPE,
                "symlink": tarfile.SYMTYPE,
                "link": tarfile.LNKTYPE,
                "fifo": tarfile.FIFOTYPE,
            }[kind]
            if kind in ("symlink", "link"):
                info.linkname = "/etc/shadow"
            info.size = len(content or b"")
            tar.addfile(info, io.BytesIO(content) if content else None)
    return buffer.getvalue()


def members(data: bytes) -> dict[str, tuple[str, int, int]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: ("dir" if m.isdir() else "file", m.mode, m.uid) for m in tar.getmembers()}


def test_only_regular_files_and_directories_under_the_declared_paths_cross():
    data = archive(
        ("app", None, "dir", 0o755),
        ("app/out.txt", b"result", "file", 0o4755),
        ("app/secret", b"x", "file", 0o644),
        ("app/link", None, "symlink", 0o777),
        ("app/hard", None, "link", 0o644),
        ("app/fifo", None, "fifo", 0o644),
        ("logs/artifacts/plot.png", b"png", "file", 0o644),
        ("../escape", b"x", "file", 0o644),
        ("/etc/passwd", b"x", "file", 0o644),
        ("data/results", None, "dir", 0o700),
        ("data/results/a.csv", b"a", "file", 0o600),
    )
    kept, dropped = safe_artifacts(data, artifact_paths(["/app/out.txt", "/data/results/"]))
    assert members(kept) == {
        "app": ("dir", 0o755, 0),
        "app/out.txt": ("file", 0o755, 0),  # the set-uid bit is gone, owner root
        "logs/artifacts/plot.png": ("file", 0o644, 0),
        "data/results": ("dir", 0o700, 0),
        "data/results/a.csv": ("file", 0o600, 0),
    }
    assert sorted(dropped) == sorted(["app/secret", "app/link", "app/hard", "app/fifo", "../escape", "/etc/passwd"])
    with tarfile.open(fileobj=io.BytesIO(kept)) as tar:
        member = tar.extractfile("app/out.txt")
        assert member is not None  # a regular file
        assert member.read() == b"result"


def test_a_file_in_place_of_a_declared_paths_parent_does_not_cross():
    kept, dropped = safe_artifacts(archive(("app", b"not a directory", "file", 0o644)), ["/app/out.txt"])
    assert members(kept) == {} and dropped == ["app"]


def test_garbage_is_a_value_error():
    with pytest.raises(ValueError, match="not a tar archive"):
        safe_artifacts(b"garbage" * 100, ["/app"])


def test_artifact_paths_always_include_logs_artifacts_once():
    assert artifact_paths(["/app/out.txt", "app/out.txt/", "/logs/artifacts"]) == ["/app/out.txt", "/logs/artifacts"]


def test_a_sparse_member_is_dropped_whatever_it_claims(tmp_path):
    """A 4 KB archive whose one member claims a GiB (GNU tar's sparse format) must not unpack into a
    GiB on the host: it is dropped."""
    (tmp_path / "app").mkdir()
    with open(tmp_path / "app" / "big", "wb") as handle:
        handle.truncate(1 << 30)
    (tmp_path / "app" / "small").write_bytes(b"ok")
    data = subprocess.run(
        ["tar", "-C", str(tmp_path), "-cSf", "-", "app/big", "app/small"], capture_output=True, check=True
    ).stdout
    assert len(data) < 64 << 10
    kept, dropped = safe_artifacts(data, ["/app"])
    assert dropped == ["app/big"] and members(kept) == {"app/small": ("file", 0o644, 0)}


def test_the_files_kept_add_up_to_at_most_the_limit():
    data = archive(*[(f"app/f{i}", b"x" * 400, "file", 0o644) for i in range(5)], ("app/g", b"y" * 100, "file", 0o644))
    kept, dropped = safe_artifacts(data, ["/app"], limit=1000)
    assert sorted(members(kept)) == ["app/f0", "app/f1", "app/g"] and dropped == ["app/f2", "app/f3", "app/f4"]


def test_entries_that_conflict_with_one_kept_before_are_dropped():
    """``f`` and then ``f/x`` (or the same name twice, or a directory and then a file of its name)
    would fail to unpack, or replace what was kept: the later one is dropped."""
    data = archive(
        ("app/f", b"file", "file", 0o644),
        ("app/f/x", b"below a file", "file", 0o644),
        ("app/f", b"again", "file", 0o644),
        ("app/d/y", b"y", "file", 0o644),
        ("app/d", b"a file where a directory is", "file", 0o644),
        ("app/d", None, "dir", 0o755),
    )
    kept, dropped = safe_artifacts(data, ["/app"])
    assert members(kept) == {"app/f": ("file", 0o644, 0), "app/d/y": ("file", 0o644, 0), "app/d": ("dir", 0o755, 0)}
    assert dropped == ["app/f/x", "app/f", "app/d"]


def test_names_too_long_to_unpack_are_dropped_and_names_not_utf8_are_replaced():
    long_component, long_path = "a" * 300, "/".join(["b" * 200] * 20)
    data = archive(
        (f"app/{long_component}", b"x", "file", 0o644),
        (f"app/{long_path}", b"x", "file", 0o644),
        ("app/\udc9bname", b"x", "file", 0o644),
    )
    kept, dropped = safe_artifacts(data, ["/app"])
    assert dropped == [f"app/{long_component}", f"app/{long_path}"]
    assert list(members(kept)) == ["app/\ufffdname"]
