"""After a non-editable install (the wheel), the bundled tasks and the assertion kit are there."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

ROOT = REPO_ROOT


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's wheel, built from a copy so that setuptools' build/ never lands in the checkout."""
    out = tmp_path_factory.mktemp("wheel")
    ignored = shutil.ignore_patterns(".venv", ".git", ".typecheck", "runs", "build", "*.egg-info", "__pycache__")
    shutil.copytree(ROOT, out / "source", ignore=ignored)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(out / "source")],
        check=True,
        capture_output=True,
        cwd=out,
    )
    (built,) = out.glob("termgym-*.whl")
    return built


@pytest.mark.slow
def test_wheel_carries_tasks_and_kit_and_they_load(tmp_path, wheel):
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(site)
    assert "termgym/verifiers/kit/assert.sh" in names
    assert "termgym/py.typed" in names  # type checkers read the package's annotations
    source = [p.relative_to(ROOT).as_posix() for p in (ROOT / "termgym").rglob("*.py")]
    missing = [path for path in source if "__pycache__" not in path and path not in names]
    assert not missing, f"modules left out of the wheel (pyproject's packages): {missing}"
    assert "termgym/envs/file-ops/bulk-rename/tests/test.sh" in names
    assert "termgym/envs/shell-scripting/fix-normalize-script/environment/normalize-names.sh" in names
    probe = (
        "import termgym, termgym.tasks.bundled as b, termgym.episode.verification as v;"
        "from termgym.tasks import discover_tasks;"
        "tasks = discover_tasks(b.bundled_root());"
        f"assert str(b.bundled_root()).startswith({str(site)!r}), b.bundled_root();"
        "assert len(v.assertion_kit()) > 100;"
        "print(len(tasks))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) == len(list((ROOT / "envs").glob("*/*/task.toml")))


@pytest.mark.slow
def test_the_wheel_installs_under_the_termgym_namespace_beside_another_verifiers(tmp_path, wheel):
    """A fresh venv holds the wheel (not editable) and a dummy top-level ``verifiers`` (the name of
    a widely used PyPI library): both import, neither shadows the other, and ``termgym train``
    reaches the trainer through its entry point."""
    with zipfile.ZipFile(wheel) as archive:
        tops = {name.split("/")[0] for name in archive.namelist()}
    assert tops == {"termgym", wheel.name.split("-py3")[0] + ".dist-info"}, (
        tops
    )  # no top-level verifiers, trainer or envs
    fresh = tmp_path / "fresh"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(fresh)], check=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(fresh / "bin" / "python"),
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
    )
    (site,) = fresh.glob("lib/python*/site-packages")
    (site / "verifiers").mkdir()
    (site / "verifiers" / "__init__.py").write_text('"""Not termgym\'s."""\nDUMMY = "the other verifiers"\n')
    # termgym's dependencies from the test venv, after the fresh site (its editable hook is not run)
    (site / "deps.pth").write_text(next(p for p in sys.path if p.endswith("site-packages")) + "\n")
    probe = (
        "import verifiers, termgym, termgym.verifiers, termgym.trainer.losses, termgym.envs.families;"
        "from termgym.verifiers import select_report;"
        "assert verifiers.DUMMY == 'the other verifiers';"
        f"assert all(m.__file__.startswith({str(site)!r}) for m in (termgym, termgym.verifiers, termgym.trainer.losses, termgym.envs.families));"
        "assert not hasattr(verifiers, 'select_report')"
    )
    environ = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    result = subprocess.run(
        [str(fresh / "bin" / "python"), "-c", probe], capture_output=True, text=True, cwd=tmp_path, env=environ
    )
    assert result.returncode == 0, result.stderr
    result = subprocess.run(
        [str(fresh / "bin" / "termgym"), "train", "--help"], capture_output=True, text=True, cwd=tmp_path, env=environ
    )
    assert result.returncode == 0, result.stderr
    assert "--preset" in result.stdout
