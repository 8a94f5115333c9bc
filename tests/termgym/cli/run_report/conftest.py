"""Fixtures for the report's tests: Debian's Chromium (installed with apt-get when missing, as the
set-up scripts do) and a headless run of it that leaves no process behind; a real run directory
made by ``termgym run`` on the embedded backend."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import helpers
from tests.helpers import REPO_ROOT, write_task

BULK_RENAME = "termgym/file-ops/bulk-rename"
# What the agent prints (its command's output) and the task's instruction: markup that would run
# if the report did not escape it.
EVIL_OUTPUT = "<script>document.title='PWNED'</script><b id=\"injected\">bold</b>"
EVIL_INSTRUCTION = 'Write the word done into /app/result.txt. <img id="evil-img" src=x>'


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


@dataclass
class Headless:
    """One headless Chromium run: its standard output and its process group (gone afterwards)."""

    stdout: str
    pgid: int


def run_headless(binary: str, url: str, profile: Path, *args: str, timeout: float = 90) -> Headless:
    """Run Chromium headless on ``url`` in its own process group and kill whatever of that group is
    left when it returns or times out."""
    command = [
        binary,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--disable-extensions",
        f"--user-data-dir={profile}",
        *args,
        url,
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
        _wait_group_gone(process.pid)
    if process.returncode != 0:
        raise AssertionError(f"chromium exited {process.returncode}: {stderr[-2000:]}")
    return Headless(stdout, process.pid)


def _wait_group_gone(pgid: int, within: float = 10) -> None:
    """Return once no process of group ``pgid`` is left (the killed ones reaped by init)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    raise AssertionError(f"chromium's process group {pgid} is still running after SIGKILL")


def termgym(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return helpers.termgym(*args, env=env, timeout=timeout)


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
