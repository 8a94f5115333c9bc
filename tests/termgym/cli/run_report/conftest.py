"""Fixtures for the report's tests: Debian's Chromium (installed with apt-get when missing, as the
set-up scripts do) and a real run directory made by ``termgym run`` on the embedded backend (the
headless run of Chromium and the shared names are in helpers.py)."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, write_task
from tests.termgym.cli.run_report.helpers import BULK_RENAME, EVIL_INSTRUCTION, EVIL_OUTPUT, termgym


@pytest.fixture(scope="session")
def chromium() -> str:
    """The ``chromium`` binary, installed with scripts/apt-ensure.sh's ``apt_ensure`` when absent
    (a no-op when present; fails, never skips, when it cannot be installed)."""
    script = f'. {REPO_ROOT / "scripts" / "apt-ensure.sh"} && apt_ensure "report tests" chromium:chromium'
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=900)
    found = shutil.which("chromium")
    if result.returncode != 0 or found is None:
        pytest.fail(f"chromium is needed and could not be installed: {result.stderr.strip()}")
    return found


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A run of 8 trials made by ``termgym run`` on the embedded backend: a bundled task and a
    task whose solution prints markup (``EVIL_OUTPUT``), each twice with the oracle and twice with
    the null agent, into one run directory."""
    root = tmp_path_factory.mktemp("report-run")
    evil = write_task(
        root,
        "evil",
        instruction=EVIL_INSTRUCTION,
        solve_sh=f"#!/bin/bash\ncat <<'END'\n{EVIL_OUTPUT}\nEND\necho done > /app/result.txt\n",
    )
    run = root / "run"
    sandboxes = Path(tempfile.mkdtemp(prefix="termgym-test-sandboxes-"))
    sandboxes.chmod(0o755)
    try:
        for agent in ("oracle", "null"):
            result = termgym(
                "run", BULK_RENAME, str(evil), "--agent", agent, "-k", "2", "--out", str(run),
                env={"TERMGYM_SANDBOX_DIR": str(sandboxes)},
            )  # fmt: skip
            assert result.returncode == 0, result.stderr[-3000:]
        yield run
    finally:
        shutil.rmtree(sandboxes, ignore_errors=True)
