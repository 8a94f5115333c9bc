"""Which of the engine's changed paths count as system changes (termgym.tamper): a table."""

from __future__ import annotations

import pytest

from termgym.sandboxes.changes import system_changes
from termgym.tamper import MAX_LISTED, tamper_warning


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
