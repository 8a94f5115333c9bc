"""The content hash of a build context (``termgym.images.context``) and the keys made from it: two
contexts that differ in anything a build reads get different digests, even when their names, sizes
and times are the same; identical contents get the same digest wherever they are."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from termgym.images import build, context
from termgym.images.context import context_digest
from termgym.sandboxes.local.env_cache import environment_key
from termgym.sandboxes.local.pool import files_digest

TIME_NS = 1_700_000_000_123_456_789

# every key that identifies an environment recipe, as a function of a context directory
KEYS: dict[str, Callable[[Path], str]] = {
    "context_digest": context_digest,
    "docker image tag (build.context_digest)": lambda ctx: build.context_digest(ctx, "FROM x\n"),
    "embedded prepared environment (environment_key)": lambda ctx: environment_key(b"FROM x\n", ctx, {}, ["app"]),
    "embedded warm pool recipe (files_digest)": lambda ctx: files_digest(ctx, ctx / "Dockerfile"),
}


def make_context(root: Path, files: dict[str, bytes]) -> Path:
    """A context holding ``files`` (relative name to bytes), every entry's times set to one value."""
    root.mkdir(parents=True)
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    for path in [*root.rglob("*"), root]:
        os.utime(path, ns=(TIME_NS, TIME_NS), follow_symlinks=False)
    return root


def stat_view(root: Path) -> list[tuple[str, int, int, int]]:
    return [
        (p.relative_to(root).as_posix(), p.lstat().st_size, p.lstat().st_mtime_ns, p.lstat().st_mode)
        for p in sorted(root.rglob("*"))
    ]


@pytest.mark.parametrize("key", KEYS.values(), ids=KEYS.keys())
def test_same_names_sizes_and_times_but_other_bytes_is_another_key(tmp_path: Path, key: Callable[[Path], str]):
    common = {"Dockerfile": b"FROM x\nCOPY . /app\n", "sub/data.bin": b"\x00" * 4096}
    first = make_context(tmp_path / "first", {**common, "secret.txt": b"aaaa\n"})
    second = make_context(tmp_path / "second", {**common, "secret.txt": b"bbbb\n"})
    assert stat_view(first) == stat_view(second)
    assert key(first) != key(second)
    twin = make_context(tmp_path / "twin", {**common, "secret.txt": b"aaaa\n"})
    assert key(twin) == key(first)  # content alone: another place and inode, the same key


@pytest.mark.parametrize("key", KEYS.values(), ids=KEYS.keys())
def test_a_file_holding_the_next_entry_is_not_two_files(tmp_path: Path, key: Callable[[Path], str]):
    # Without framing, one file whose bytes are another's plus the next entry's header hashes as the
    # two files: the Docker image tag once did (``\0name\0mode\0`` then unframed bytes).
    header = f"\0b\0{0o100644:o}\0".encode()
    two = make_context(tmp_path / "two", {"a": b"X", "b": b"Y"})
    one = make_context(tmp_path / "one", {"a": b"X" + header + b"Y"})
    for path in (two / "a", two / "b", one / "a"):
        path.chmod(0o644)
    assert key(one) != key(two)


def test_modes_kinds_and_link_targets_count(tmp_path: Path):
    context = make_context(tmp_path / "ctx", {"run.sh": b"echo\n"})
    seen = {context_digest(context)}
    (context / "run.sh").chmod(0o755)
    seen.add(context_digest(context))
    (context / "link").symlink_to("run.sh")
    seen.add(context_digest(context))
    (context / "link").unlink()
    (context / "link").symlink_to("elsewhere")
    seen.add(context_digest(context))
    (context / "link").unlink()
    (context / "link").mkdir()  # a directory where the link was
    seen.add(context_digest(context))
    (context / "link").rmdir()
    (context / "link").write_bytes(b"")  # an empty file there
    seen.add(context_digest(context))
    assert len(seen) == 6


def test_git_is_left_out_only_where_the_builder_does_not_send_it(tmp_path: Path):
    context = make_context(tmp_path / "ctx", {"Dockerfile": b"FROM x\n", ".git/HEAD": b"ref: a\n"})
    before = (context_digest(context), context_digest(context, skip_git=True))
    (context / ".git" / "HEAD").write_bytes(b"ref: b\n")
    assert context_digest(context) != before[0]  # the embedded backend's COPY copies .git
    assert context_digest(context, skip_git=True) == before[1]  # Docker's tar leaves it out
    assert ".git" not in {p.name for p in build.context_files(context)}


def test_no_context_is_one_fixed_digest():
    assert context_digest(None) == context_digest(None) != ""


# -- what file_sha256 remembers ---------------------------------------------------------------------


def rewrite_in_place(path: Path, data: bytes) -> None:
    """New bytes of the same size, the modification time set back to what it was."""
    before = path.stat()
    assert len(data) == before.st_size
    path.write_bytes(data)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def reads(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every file whose bytes ``file_sha256`` reads from now on."""
    seen: list[object] = []
    real = hashlib.file_digest

    def counted(file, digest):
        seen.append(file)
        return real(file, digest)

    monkeypatch.setattr(context.hashlib, "file_digest", counted)
    return seen


def test_a_settled_file_is_read_once_and_read_again_once_rewritten(tmp_path: Path, monkeypatch):
    path = tmp_path / "data.bin"
    path.write_bytes(b"a" * 4096)
    time.sleep(context.SETTLED_NS / 1e9)
    context.forget_file_digests()
    seen = reads(monkeypatch)
    first = context.file_sha256(path)
    assert context.file_sha256(path) == first == hashlib.sha256(b"a" * 4096).digest()
    assert len(seen) == 1  # remembered
    rewrite_in_place(path, b"b" * 4096)  # same size and mtime; its ctime is now, no longer the settled one
    assert context.file_sha256(path) == hashlib.sha256(b"b" * 4096).digest()
    assert len(seen) == 2


def test_a_file_written_within_the_settling_time_is_read_at_every_call(tmp_path: Path, monkeypatch):
    """A rewrite within one timestamp tick keeps size, mtime and ctime: only the bytes tell."""
    path = tmp_path / "data.bin"
    path.write_bytes(b"a" * 4096)
    seen = reads(monkeypatch)
    assert context.file_sha256(path) == hashlib.sha256(b"a" * 4096).digest()
    rewrite_in_place(path, b"b" * 4096)
    assert context.file_sha256(path) == hashlib.sha256(b"b" * 4096).digest()
    assert context.file_sha256(path) == hashlib.sha256(b"b" * 4096).digest()
    assert len(seen) == 3
