"""Host programs are found by absolute path in system directories, never on PATH."""

from __future__ import annotations

from pathlib import Path

import pytest

from termgym.errors import BackendUnavailable
from termgym.sandboxes import tools


def test_a_program_is_found_in_the_system_directories_whatever_path_says(tmp_path, monkeypatch):
    decoy = tmp_path / "nsenter"
    decoy.write_text("#!/bin/sh\nexit 0\n")
    decoy.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    tools.host_tool.cache_clear()
    try:
        found = tools.host_tool("nsenter")
    finally:
        tools.host_tool.cache_clear()
    assert found.startswith(tools.TRUSTED_DIRS) and found != str(decoy)


def test_a_missing_program_names_its_package():
    with pytest.raises(BackendUnavailable, match="apt-get install no-such-program-here"):
        tools.host_tool("no-such-program-here")


def test_a_program_others_can_write_is_not_trusted(tmp_path):
    writable = tmp_path / "tool"
    writable.write_text("#!/bin/sh\n")
    writable.chmod(0o777)
    assert not tools._root_only(writable)
    assert tools._root_only(Path(tools.host_tool("sh")))
