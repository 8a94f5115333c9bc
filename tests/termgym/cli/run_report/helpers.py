"""What the report's tests share besides fixtures: the task names and the markup a run's agent
prints, ``termgym`` with the report tests' timeout, and a headless run of Chromium that leaves no
process behind (the Chromium binary and the run directory are conftest.py's fixtures)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests import helpers

BULK_RENAME = "termgym/file-ops/bulk-rename"
# What the agent prints (its command's output) and the task's instruction: markup that would run
# if the report did not escape it.
EVIL_OUTPUT = "<script>document.title='PWNED'</script><b id=\"injected\">bold</b>"
EVIL_INSTRUCTION = 'Write the word done into /app/result.txt. <img id="evil-img" src=x>'


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
