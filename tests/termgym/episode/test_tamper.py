"""Which of the engine's changed paths count as system changes (termgym.episode.tamper), and which search-path
entries the verifier keeps: tables."""

from __future__ import annotations

import pytest

from termgym.episode.tamper import MAX_LISTED, tamper_warning
from termgym.sandboxes.changes import system_changes, trusted_search_paths, watched_paths


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ([], []),
        # a shim on PATH: the directories above it are listed by the engine only because it changed
        (
            [("/usr", "C"), ("/usr/local", "C"), ("/usr/local/bin", "C"), ("/usr/local/bin/mv", "A")],
            ["/usr/local/bin/mv"],
        ),
        ([("/etc", "C"), ("/etc/ld.so.preload", "A")], ["/etc/ld.so.preload"]),
        (
            [("/usr/bin/sh", "C"), ("/lib/x86_64-linux-gnu/libc.so.6", "C"), ("/boot/vmlinuz", "D")],
            ["/boot/vmlinuz", "/lib/x86_64-linux-gnu/libc.so.6", "/usr/bin/sh"],
        ),
        # files planted at the top, and a system directory removed
        ([("/pytest.ini", "A"), ("/conftest.py", "A"), ("/sbin", "D")], ["/conftest.py", "/pytest.ini", "/sbin"]),
        # the agent's own work is not a system change, nor a top-level directory it changed inside
        (
            [
                ("/app", "C"),
                ("/app/out.txt", "A"),
                ("/tmp", "C"),
                ("/tmp/x", "A"),
                ("/root", "C"),
                ("/root/.bashrc", "C"),
                ("/var", "C"),
                ("/var/log/x", "A"),
                ("/opt/tool", "A"),
            ],
            [],
        ),
        (
            [("/data", "A"), ("/data/x", "A")],
            [],
        ),  # a new top-level directory holding work: its files are listed, not it
        ([("/root", "C")], []),  # a top-level directory changed, not added or removed
        # what the engine itself puts into every container
        (
            [
                ("/usr/sbin/docker-init", "A"),
                ("/etc/hostname", "C"),
                ("/etc/hosts", "C"),
                ("/etc/resolv.conf", "C"),
                ("/.dockerenv", "A"),
            ],
            [],
        ),
        (
            [("/usr/binary-lookalike/x", "A"), ("/usrx", "C")],
            ["/usr/binary-lookalike/x"],
        ),  # a prefix is a whole component
    ],
)
def test_system_changes(changes, expected):
    assert system_changes(changes) == expected


def test_the_warning_names_the_first_paths_and_counts_the_rest():
    paths = [f"/usr/bin/tool{i:03d}" for i in range(MAX_LISTED + 7)]
    warning = tamper_warning(paths)
    assert warning.startswith(f"the agent changed {MAX_LISTED + 7} system path(s)")
    assert "/usr/bin/tool000" in warning and f"/usr/bin/tool{MAX_LISTED - 1:03d}" in warning
    assert f"/usr/bin/tool{MAX_LISTED:03d}" not in warning and warning.endswith("and 7 more")


@pytest.mark.parametrize(
    ("changes", "watched", "expected"),
    [
        # a shim in a directory a task's [verifier].env trusts is tampering; elsewhere it is work
        ([("/opt/venv/bin/pytest", "C"), ("/app/x", "A")], ("/opt/venv", "/opt/venv/bin"), ["/opt/venv/bin/pytest"]),
        ([("/opt/venv/bin/pytest", "C")], (), []),
        # an image's entrypoint, which every restart runs again
        ([("/docker-entrypoint.sh", "C")], ("/docker-entrypoint.sh",), ["/docker-entrypoint.sh"]),
        ([("/docker-entrypoint.sh", "C")], (), []),
        ([("/opt/venvx/a", "A")], ("/opt/venv",), []),  # a whole component
    ],
)
def test_system_changes_count_the_watched_paths(changes, watched, expected):
    assert system_changes(changes, watched) == expected


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


def test_watched_paths_are_the_writable_places_a_trusted_environment_searches():
    env = {"PATH": "/opt/venv/bin:/usr/bin", "PYTHONPATH": "/srv/lib:relative", "HOME": "/x", "NODE_OPTIONS": "/a"}
    assert watched_paths(env) == ("/opt/venv", "/opt/venv/bin", "/srv/lib")
    assert watched_paths({"PATH": "/usr/local/bin:/bin"}) == ()
