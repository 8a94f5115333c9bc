"""The pull policy's decisions, a pull's progress line, its one-line errors, the image a task runs
(its ``docker_image`` or its Dockerfile) and the digest a record gets: pure parts, with tables."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from termgym.images.build import builds_dockerfile, image_digest, local_only
from termgym.images.pull import PullProgress, absent_error, pull_error, pull_needed, stderr_reporter


@pytest.mark.parametrize(
    ("policy", "present", "pulled_before", "expected"),
    [
        ("missing", False, False, True),
        ("missing", True, False, False),
        ("missing", True, True, False),
        ("never", False, False, False),
        ("never", True, False, False),
        ("always", True, False, True),
        ("always", False, False, True),
        ("always", True, True, False),  # once per process
    ],
)
def test_pull_needed(policy, present, pulled_before, expected):
    assert pull_needed(policy, present, pulled_before) is expected


@pytest.mark.parametrize(
    ("dockerfile", "image", "prefer_build", "expected"),
    [
        (Path("Dockerfile"), "repo/img:1", False, False),  # the named image wins, as in Harbor
        (Path("Dockerfile"), "repo/img:1", True, True),  # --build
        (Path("Dockerfile"), None, False, True),
        (Path("Dockerfile"), "", False, True),
        (None, "repo/img:1", True, False),  # nothing to build
        (None, None, False, False),
    ],
)
def test_builds_dockerfile(dockerfile, image, prefer_build, expected):
    assert builds_dockerfile(dockerfile, image, prefer_build) is expected


def test_local_only_names_both_sides_of_every_alias():
    assert local_only({"debian:12": "termgym/base:bookworm", "a:1": "b:2"}) == {
        "debian:12",
        "termgym/base:bookworm",
        "a:1",
        "b:2",
    }


@pytest.mark.parametrize(
    ("info", "ref", "expected"),
    [
        (
            {"Id": "sha256:aa", "RepoDigests": ["other/x@sha256:11", "127.0.0.1:5000/test/img@sha256:22"]},
            "127.0.0.1:5000/test/img:1",
            "127.0.0.1:5000/test/img@sha256:22",
        ),
        ({"Id": "sha256:aa", "RepoDigests": ["other/x@sha256:11"]}, "mine:1", "other/x@sha256:11"),
        ({"Id": "sha256:aa", "RepoDigests": []}, "termgym-task/demo:0123", "sha256:aa"),
        ({"Id": "sha256:aa"}, "repo@sha256:22", "sha256:aa"),
        ({"Id": "sha256:aa", "RepoDigests": ["repo@sha256:22"]}, "repo@sha256:22", "repo@sha256:22"),
        ({"Id": "sha256:aa", "RepoDigests": ["host:5000/r@sha256:3"]}, "host:5000/r", "host:5000/r@sha256:3"),
    ],
)
def test_image_digest(info, ref, expected):
    assert image_digest(info, ref) == expected


def test_pull_progress_sums_layers_and_ignores_image_status_lines():
    progress = PullProgress("r/img:1")
    chunks = [
        {"status": "Pulling from r/img", "id": "1"},
        {"status": "Pulling fs layer", "id": "aaaaaaaaaaaa"},
        {"status": "Pulling fs layer", "id": "bbbbbbbbbbbb"},
        {"status": "Downloading", "id": "aaaaaaaaaaaa", "progressDetail": {"current": 1_000_000, "total": 4_000_000}},
        {"status": "Downloading", "id": "bbbbbbbbbbbb", "progressDetail": {"current": 500_000, "total": 1_000_000}},
        {"status": "Pull complete", "id": "bbbbbbbbbbbb"},
        {"status": "Digest: sha256:00"},
    ]
    assert all(progress.feed(chunk) is None for chunk in chunks)
    assert progress.line() == "pulling r/img:1: 1/2 layers, 2.0/5.0 MB"


def test_pull_progress_returns_the_streams_error():
    assert PullProgress("x").feed({"error": "manifest unknown"}) == "manifest unknown"


def test_pull_errors_are_one_line_naming_the_image_and_the_ways_out():
    error = pull_error("r/img:1", "demo", 'Get "http://r/v2/":\n  dial tcp: connection refused')
    message = str(error)
    assert error.kind == "build_failed" and "\n" not in message
    assert message.startswith("demo: could not pull image r/img:1: Get")
    assert "--image-alias r/img:1=LOCAL" in message and "--pull never" in message
    absent = str(absent_error("r/img:1", "demo"))
    assert "r/img:1 is not present" in absent and "--pull never" in absent and "\n" not in absent


def test_reporter_off_a_terminal_writes_one_line():
    out = io.StringIO()
    report = stderr_reporter("r/img:1", out)
    for line in ("pulling r/img:1: 0/0 layers", "pulling r/img:1: 1/2 layers", None):
        report(line)
    assert out.getvalue() == "termgym: pulling r/img:1\n"
