"""Pure parts of the Docker backend: aliases, FROM rewriting, content digests, stream frames."""

from __future__ import annotations

import re
import struct

import pytest

from termgym.images.build import (
    BASE_IMAGE,
    DEFAULT_ALIASES,
    base_images,
    context_digest,
    load_aliases,
    parse_alias,
    rewrite_from,
    task_image_tag,
)
from termgym.sandboxes.docker import FrameDemux


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a:1=b:2", ("a:1", "b:2")),
        (" debian:bookworm-slim = termgym/base:bookworm ", ("debian:bookworm-slim", "termgym/base:bookworm")),
    ],
)
def test_parse_alias(text, expected):
    assert parse_alias(text) == expected


@pytest.mark.parametrize("text", ["nothing", "=b", "a=", ""])
def test_parse_alias_rejects(text):
    with pytest.raises(ValueError, match=re.escape(f"an image alias is NAME=IMAGE, got {text!r}")):
        parse_alias(text)


ALIASES = {"debian:bookworm-slim": BASE_IMAGE, "python:3.12": "local/python:3.12"}


@pytest.mark.parametrize(
    ("dockerfile", "present", "expected"),
    [
        ("FROM debian:bookworm-slim\nRUN true\n", set(), f"FROM {BASE_IMAGE}\nRUN true\n"),
        ("FROM debian:bookworm-slim\n", {"debian:bookworm-slim"}, "FROM debian:bookworm-slim\n"),
        (
            "from --platform=linux/amd64 python:3.12 AS build\nFROM build\n",
            set(),
            "from --platform=linux/amd64 local/python:3.12 AS build\nFROM build\n",
        ),
        ("FROM alpine:3\n", set(), "FROM alpine:3\n"),
        ("FROM debian:bookworm-slim", set(), f"FROM {BASE_IMAGE}"),
    ],
)
def test_rewrite_from(dockerfile, present, expected):
    assert rewrite_from(dockerfile, ALIASES, lambda ref: ref in present) == expected


@pytest.mark.parametrize(
    ("dockerfile", "expected"),
    [
        ("FROM a:1\n", ["a:1"]),
        ("FROM a:1 AS build\nFROM build\nFROM scratch\nFROM b\n", ["a:1", "b"]),
        ("FROM --platform=x a:1 as one\nFROM ONE\n", ["a:1"]),
    ],
)
def test_base_images(dockerfile, expected):
    assert base_images(dockerfile) == expected


def test_context_digest_tracks_content_modes_and_dockerfile(tmp_path):
    (tmp_path / "data.txt").write_text("one")
    first = context_digest(tmp_path, "FROM x\n")
    assert context_digest(tmp_path, "FROM x\n") == first
    assert context_digest(tmp_path, "FROM y\n") != first
    (tmp_path / "data.txt").write_text("two")
    second = context_digest(tmp_path, "FROM x\n")
    assert second != first
    (tmp_path / "data.txt").chmod(0o755)
    assert context_digest(tmp_path, "FROM x\n") != second


def test_task_image_tag_is_a_valid_reference():
    tag = task_image_tag("termgym/File-Ops/Bulk Rename", "ab" * 32)
    assert tag == "termgym-task/termgym-file-ops-bulk-rename:" + "ab" * 8


def test_load_aliases_layers_defaults_config_and_flags(tmp_path):
    config = tmp_path / "termgym.toml"
    config.write_text('[images.aliases]\n"ubuntu:24.04" = "mine/ubuntu:24.04"\n')
    aliases = load_aliases(["python:3=mine/python:3"], config_files=[str(config)])
    assert aliases["ubuntu:24.04"] == "mine/ubuntu:24.04" and aliases["python:3"] == "mine/python:3"
    assert all(aliases[k] == v for k, v in DEFAULT_ALIASES.items())
    config.write_text("[images\n")
    with pytest.raises(ValueError, match=r"termgym\.toml"):
        load_aliases([], config_files=[str(config)])


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(payload)) + payload


@pytest.mark.parametrize("split", [1, 3, 7, 8, 9, 1000])
def test_frame_demux_reassembles_any_split(split):
    stream = frame(1, b"hello ") + frame(2, b"err ") + frame(1, b"") + frame(1, b"world")
    demux = FrameDemux()
    out = b"".join(demux.feed(stream[i : i + split]) for i in range(0, len(stream), split))
    assert out == b"hello err world"
