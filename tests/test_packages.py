"""The tree's package rules: every folder of library code is a package (an ``__init__.py`` of its
own, listed in pyproject.toml's ``[tool.setuptools] packages``), the folders installed under
another name (``trainer/`` as ``termgym.trainer``, ...) import their own modules relatively, and no
test module imports from a ``conftest.py`` (fixtures reach a test by name; what tests share
otherwise is in a helpers module)."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.helpers import REPO_ROOT
from tests.test_layers import PACKAGES, TASK_DIRS


def package_dirs(root: Path) -> dict[str, Path]:
    """Every folder of ``root`` (a checkout) that holds library modules, by its installed name."""
    found = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.parent.relative_to(root / folder)
            if folder == "envs" and relative.parts and relative.parts[0] in TASK_DIRS:
                continue
            found[".".join([*package.split("."), *relative.parts])] = path.parent
    return found


def conftest_imports(path: Path) -> list[str]:
    """The imports in ``path`` that name a ``conftest`` module (absolute or relative)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[-1] == "conftest"]
        elif isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            if module.split(".")[-1] == "conftest" or any(alias.name == "conftest" for alias in node.names):
                found.append(f"{module} ({', '.join(alias.name for alias in node.names)})")
    return found


def test_every_folder_of_library_code_is_a_listed_package():
    folders = package_dirs(REPO_ROOT)
    assert "termgym.episode" in folders and "termgym.envs.families.long" in folders  # the walk sees nested folders
    unmarked = sorted(name for name, folder in folders.items() if not (folder / "__init__.py").is_file())
    assert unmarked == [], "packages without an __init__.py"
    listed = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted(set(folders) - set(listed)) == [], "packages pyproject.toml does not list"
    assert sorted(set(listed) - set(folders)) == [], "packages pyproject.toml lists that the tree lacks"


def test_no_test_module_imports_from_a_conftest():
    found = {
        str(path.relative_to(REPO_ROOT)): imports
        for path in sorted((REPO_ROOT / "tests").rglob("*.py"))
        if (imports := conftest_imports(path))
    }
    assert found == {}, "import fixtures by name (a test's parameter) and helpers from a helpers module"


def test_the_conftest_check_sees_every_spelling_of_the_import(tmp_path: Path):
    spellings = [
        "from tests.a.conftest import x",
        "from .conftest import x",
        "from . import conftest",
        "import tests.a.conftest",
        "import conftest",
    ]
    for line in spellings:
        (tmp_path / "test_x.py").write_text(line + "\n")
        assert conftest_imports(tmp_path / "test_x.py"), line
    (tmp_path / "test_x.py").write_text("from tests.a.helpers import conftest_like\nimport tests.a.helpers\n")
    assert conftest_imports(tmp_path / "test_x.py") == []


def own_package_imports(path: Path, package: str) -> list[str]:
    """The imports in ``path`` that name ``package`` or a module under it by its installed name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [name for name in names if name == package or name.startswith(package + ".")]
    return found


def test_a_folder_installed_under_another_name_imports_its_own_modules_relatively():
    found = {}
    for folder, package in PACKAGES.items():
        if folder == package:  # termgym/: its installed name is its path
            continue
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            relative = path.relative_to(REPO_ROOT / folder)
            if folder == "envs" and relative.parts[0] in TASK_DIRS:
                continue
            if imports := own_package_imports(path, package):
                found[str(path.relative_to(REPO_ROOT))] = imports
    assert found == {}, "import the folder's own modules relatively (CONTRIBUTING.md: finding a module's file)"


def test_the_own_package_check_sees_the_installed_name_only(tmp_path: Path):
    for line in (
        "from termgym.trainer.config import Config",
        "from termgym.trainer import losses",
        "import termgym.trainer",
    ):
        (tmp_path / "x.py").write_text(line + "\n")
        assert own_package_imports(tmp_path / "x.py", "termgym.trainer"), line
    (tmp_path / "x.py").write_text(
        "from .config import Config\nfrom termgym.trainers import x\nimport termgym.errors\n"
    )
    assert own_package_imports(tmp_path / "x.py", "termgym.trainer") == []
