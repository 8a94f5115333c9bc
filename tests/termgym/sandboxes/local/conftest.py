"""Fixtures of the embedded backend's tests."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from termgym.sandboxes.local.env_cache import EnvCache


@pytest.fixture
def cache_dir(no_leaks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A prepared-environment cache of this test's own under /tmp (its entries' unprivileged owners
    must reach it), emptied at its end: nothing may use it then."""
    root = Path(f"/tmp/termgym-test-envcache-{os.getpid()}-{tmp_path.name}")
    monkeypatch.setenv("TERMGYM_ENV_CACHE_DIR", str(root))
    yield root
    assert EnvCache(root / "envs", max_bytes=0, max_entries=0).clear()[1] == 0, "an entry still in use"
    subprocess.run(["rm", "-rf", str(root)], check=True)


@pytest.fixture
def scratch() -> Iterator[Path]:
    """A directory of this test's own under /tmp, mode 0755 (a sandbox's unprivileged host uid must
    reach what is built in it, which pytest's 0700 ``tmp_path`` would refuse), removed at its end."""
    root = Path(tempfile.mkdtemp(prefix="termgym-test-scratch-", dir="/tmp"))
    root.chmod(0o755)
    yield root
    subprocess.run(["rm", "-rf", str(root)], check=False)
