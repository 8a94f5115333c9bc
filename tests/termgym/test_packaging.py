"""After a non-editable install (the wheel), the bundled tasks and the assertion kit are there."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_carries_tasks_and_kit_and_they_load(tmp_path):
    # Build from a copy, so that setuptools' build/ directory never lands in the checkout.
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".venv", ".git", "runs", "build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        check=True, capture_output=True, cwd=tmp_path,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("termgym-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(site)
    assert "verifiers/kit/assert.sh" in names
    assert "termgym/envs/file-ops/bulk-rename/tests/test.sh" in names
    assert "termgym/envs/shell-scripting/fix-normalize-script/environment/normalize-names.sh" in names
    probe = (
        "import termgym, termgym.bundled as b, termgym.verification as v;"
        "from termgym.tasks import discover_tasks;"
        "tasks = discover_tasks(b.bundled_root());"
        "assert str(b.bundled_root()).startswith(%r), b.bundled_root();"
        "assert len(v.assertion_kit()) > 100;"
        "print(len(tasks))" % str(site)
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(list((ROOT / "envs").glob("*/*/task.toml")))
