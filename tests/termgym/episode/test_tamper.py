"""What a backend's list of changes keeps (termgym.sandboxes.changes), the tamper warning, and which
search-path entries the verifier keeps: tables."""

from __future__ import annotations

import pytest

from termgym.episode.tamper import MAX_LISTED, tamper_warning
from termgym.sandboxes.changes import leaf_changes, manifest_changes, trusted_search_paths


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({}, {}),
        # a shim on PATH: the directories above it are listed by the engine only because it changed
        (
            {"/usr": "C", "/usr/local": "C", "/usr/local/bin": "C", "/usr/local/bin/mv": "A"},
            {"/usr/local/bin/mv": "A"},
        ),
        # a new directory holding work: its files are listed, not it; a new empty one is a leaf
        ({"/data": "A", "/data/x": "A", "/empty": "A"}, {"/data/x": "A", "/empty": "A"}),
        # a directory replaced by a link, deleted files
        ({"/opt/venv/bin": "C", "/boot/vmlinuz": "D"}, {"/boot/vmlinuz": "D", "/opt/venv/bin": "C"}),
        # a directory replaced by a link, as two manifests tell it: what was under it is gone
        ({"/opt/lib": "C", "/opt/lib/a.py": "D"}, {"/opt/lib": "C", "/opt/lib/a.py": "D"}),
        # what the engine itself puts into every container, and a trailing slash
        (
            {"/usr/sbin/docker-init": "A", "/etc/hostname": "C", "/.dockerenv": "A", "/etc/": "C", "/": "C"},
            {},
        ),
        ({"/usr/binary-lookalike/x": "A", "/usrx": "C"}, {"/usr/binary-lookalike/x": "A", "/usrx": "C"}),
    ],
)
def test_leaf_changes_keep_what_changed_not_the_directories_above_it(changes, expected):
    assert leaf_changes(changes) == expected
    assert list(leaf_changes(changes)) == sorted(expected)


def test_manifest_changes_tell_added_changed_and_deleted():
    before = {"/app": (1, 2, 3, 4), "/app/a": (1, 5, 3, 4), "/app/gone": (1, 6, 0, 4)}
    now = {"/app": (1, 2, 3, 9), "/app/a": (1, 5, 3, 4), "/app/new": (1, 7, 1, 9)}
    assert manifest_changes(before, now) == {"/app": "C", "/app/gone": "D", "/app/new": "A"}
    assert leaf_changes(manifest_changes(before, now)) == {"/app/gone": "D", "/app/new": "A"}


def test_the_warning_names_the_first_loads_and_counts_the_rest():
    loads = [f"/usr/bin/tool{i:03d} (added by the agent; executed by the verifier)" for i in range(MAX_LISTED + 7)]
    warning = tamper_warning(loads)
    assert warning.startswith(f"the verifier loaded {MAX_LISTED + 7} file(s) the agent wrote")
    assert "/usr/bin/tool000" in warning and f"/usr/bin/tool{MAX_LISTED - 1:03d}" in warning
    assert f"/usr/bin/tool{MAX_LISTED:03d}" not in warning and warning.endswith("and 7 more")


@pytest.mark.parametrize(
    ("env", "kept", "dropped"),
    [
        # what uv, pipx and venv images put first: gone; the system entries stay in order
        (
            {"PATH": "/root/.local/bin:/usr/local/bin:/usr/bin:/bin", "HOME": "/root"},
            {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root"},
            [("PATH", "/root/.local/bin")],
        ),
        # empty and relative entries name the working directory
        ({"PATH": "/usr/bin::.:bin"}, {"PATH": "/usr/bin"}, [("PATH", ""), ("PATH", "."), ("PATH", "bin")]),
        # Terminal-Bench 2 images: PYTHONPATH=/app; no entry left removes the variable
        ({"PYTHONPATH": "/app"}, {}, [("PYTHONPATH", "/app")]),
        ({"PYTHONPATH": "/usr/lib/python3/dist-packages"}, {"PYTHONPATH": "/usr/lib/python3/dist-packages"}, []),
        # LD_PRELOAD takes blanks and colons alike
        (
            {"LD_PRELOAD": "/usr/lib/a.so /tmp/b.so:/app/c.so"},
            {"LD_PRELOAD": "/usr/lib/a.so"},
            [
                ("LD_PRELOAD", "/tmp/b.so"),
                ("LD_PRELOAD", "/app/c.so"),
            ],
        ),
        (
            {"LD_LIBRARY_PATH": "/opt/lib", "PERL5LIB": "/srv/perl", "NODE_PATH": "/usr/lib/node"},
            {"NODE_PATH": "/usr/lib/node"},
            [("LD_LIBRARY_PATH", "/opt/lib"), ("PERL5LIB", "/srv/perl")],
        ),
        # a file a shell sources at start, and options that load code from anywhere
        (
            {"BASH_ENV": "/root/.bashrc", "NODE_OPTIONS": "--require x"},
            {},
            [
                ("BASH_ENV", "/root/.bashrc"),
                ("NODE_OPTIONS", "--require x"),
            ],
        ),
        ({"BASH_ENV": "/etc/bash.env"}, {"BASH_ENV": "/etc/bash.env"}, []),
        # a way out of a system directory is not a system directory
        ({"PATH": "/usr/../app:/usr/bin"}, {"PATH": "/usr/bin"}, [("PATH", "/usr/../app")]),
        ({"PATH": "/usrlocal/bin"}, {}, [("PATH", "/usrlocal/bin")]),
        ({"LANG": "C.UTF-8", "DEBIAN_FRONTEND": "x"}, {"LANG": "C.UTF-8", "DEBIAN_FRONTEND": "x"}, []),
    ],
)
def test_trusted_search_paths_keep_only_what_the_agent_cannot_write(env, kept, dropped):
    assert trusted_search_paths(env) == (kept, dropped)
