"""The tree's package rules: every folder of library code is a package (an ``__init__.py`` of its
own, listed in pyproject.toml's ``[tool.setuptools] packages``), the folders installed under
another name (``trainer/`` as ``termgym.trainer``, ...) import their own modules relatively, and no
test module imports from a ``conftest.py`` (fixtures reach a test by name; what tests share
otherwise is in a helpers module)."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from tests.helpers import REPO_ROOT
from tests.test_layers import PACKAGES, TASK_DIRS, module_files


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


# (module, name) -> "who still imports name from module: where it is defined"; module does not
# define it. Each entry must still be in use (a stale one fails); drop it as its importers move.
HELD_REEXPORTS = {
    ("termgym.env", "EnvOptions"): "trainer/ (being re-laid out by another change): termgym.episode.options",
    ("termgym.env", "SandboxFactory"): "trainer/rollout.py: termgym.episode.spec",
    ("termgym.env", "prewarm_sandboxes"): "trainer/rollout.py: termgym.episode.spec",
    ("termgym.env", "resolve_task"): "trainer/ppo.py: termgym.tasks.bundled",
    ("termgym.sandboxes.docker.pool", "POOL_LABEL"): "sandboxes/docker/containers.py: sandboxes/warm_pool.py",
    ("termgym.sandboxes.docker.pool", "owner_gone"): "sandboxes/docker/containers.py: sandboxes/warm_pool.py",
    ("termgym.trainer.vllm_sampler", "WeightSync"): "deliberate: the class path vLLM servers started earlier load",
}


def defined_names(path: Path) -> set[str]:
    """The names a module's own top-level code defines (functions, classes, assignments, also under
    a top-level ``if`` or ``try``), not the ones it imports."""
    found: set[str] = set()
    for statement in ast.parse(path.read_text()).body:
        nodes = ast.walk(statement) if isinstance(statement, (ast.If, ast.Try)) else [statement]
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found |= {name.id for target in targets for name in ast.walk(target) if isinstance(name, ast.Name)}
    return found


def imported_names(path: Path) -> list[tuple[str, str]]:
    """Every ``(module, name)`` of an absolute ``from termgym... import name`` in ``path``: a module's
    code, or the Python snippets of a Markdown page (one line each)."""
    if path.suffix == ".md":
        lines = re.findall(r"^\s*from (termgym[\w.]*) import ([\w, ]+)$", path.read_text(), re.MULTILINE)
        return [(module, name.strip()) for module, names in lines for name in names.split(",")]
    return [
        (module, alias.name)
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ImportFrom) and not node.level and (module := node.module or "").startswith("termgym")
        for alias in node.names
    ]


def reexports(root: Path) -> dict[tuple[str, str], list[str]]:
    """``(module, name)`` -> the files of ``root`` that import ``name`` from ``module``, a module (not a
    package: its ``__init__.py`` is its face) that does not define it."""
    modules = module_files(root)
    importers = [
        path
        for folder in ("termgym", "verifiers", "trainer", "envs", "tests", "bench", "scripts")
        for path in sorted((root / folder).rglob("*.py"))
    ]
    importers += [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    found: dict[tuple[str, str], list[str]] = {}
    for path in importers:
        for module, name in imported_names(path) if path.is_file() else []:
            source = modules.get(module)
            if source is None or source.name == "__init__.py" or name in defined_names(source):
                continue
            found.setdefault((module, name), []).append(str(path.relative_to(root)))
    return found


def test_every_name_has_one_import_path():
    found = reexports(REPO_ROOT)
    assert ("termgym.env", "AsyncTerminalEnv") not in found  # the check reads the module's own definitions
    new = {key: files for key, files in found.items() if key not in HELD_REEXPORTS}
    assert new == {}, "import a name from the module that defines it (issue 46: one import path per name)"
    stale = sorted(set(HELD_REEXPORTS) - set(found))
    assert stale == [], "no importer takes these from a re-export any more: drop them from HELD_REEXPORTS"


def test_termgym_env_exports_only_what_it_defines():
    import termgym.env

    own = defined_names(REPO_ROOT / "termgym" / "env.py")
    assert set(termgym.env.__all__) <= own
    assert {"AsyncTerminalEnv", "SUBMIT", "make"} <= set(termgym.env.__all__)


def test_the_reexport_check_sees_a_name_taken_from_where_it_is_not_defined(tmp_path: Path):
    (tmp_path / "termgym").mkdir()
    (tmp_path / "termgym" / "__init__.py").write_text("from termgym.a import A\n")
    (tmp_path / "termgym" / "a.py").write_text("class A: ...\nif True:\n    B = 1\n")
    (tmp_path / "termgym" / "b.py").write_text("from termgym.a import A\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "from termgym import A\nfrom termgym.a import A, B\nfrom termgym.b import A\n"
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "x.md").write_text("```python\nfrom termgym.b import A, C\n```\n")
    assert reexports(tmp_path) == {
        ("termgym.b", "A"): ["tests/test_x.py", "docs/x.md"],
        ("termgym.b", "C"): ["docs/x.md"],
    }


LINE_LIMIT = 120  # pyproject.toml's line-length; the formatter leaves a long string or comment as it is
DOCSTRING_LIMIT = 20  # a docstring states the guarantee; the explanation is the guide's (issue 46)


def prose_overruns(root: Path) -> tuple[list[str], list[str]]:
    """The library lines of ``root`` (a checkout) longer than ``LINE_LIMIT`` columns, as ``path:line``,
    and its docstrings (module, class, function) longer than ``DOCSTRING_LIMIT`` lines, as
    ``path:line name``."""
    long_lines, long_docstrings = [], []
    for path in module_files(root).values():
        name = str(path.relative_to(root))
        text = path.read_text()
        long_lines += [f"{name}:{n}" for n, line in enumerate(text.splitlines(), 1) if len(line) > LINE_LIMIT]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                docstring = ast.get_docstring(node) or ""
                if len(docstring.splitlines()) > DOCSTRING_LIMIT:
                    where = "module" if isinstance(node, ast.Module) else node.name
                    long_docstrings.append(f"{name}:{getattr(node, 'lineno', 1)} {where}")
    return long_lines, long_docstrings


def test_library_prose_is_short():
    long_lines, long_docstrings = prose_overruns(REPO_ROOT)
    assert long_lines == [], f"lines over {LINE_LIMIT} columns: {long_lines}"
    assert long_docstrings == [], (
        f"docstrings over {DOCSTRING_LIMIT} lines (keep the guarantee, point to the guide): {long_docstrings}"
    )


def test_the_prose_check_sees_a_long_line_and_a_long_docstring(tmp_path: Path):
    (tmp_path / "termgym").mkdir()
    lines = "\n".join(f"line {n}" for n in range(DOCSTRING_LIMIT + 1))
    (tmp_path / "termgym" / "a.py").write_text(f'"""{lines}"""\n\n\nclass A:\n    """{lines}"""\n')
    (tmp_path / "termgym" / "b.py").write_text(f'"""Short."""\n\nX = "{"x" * LINE_LIMIT}"\n')
    exact = "\n".join(f"line {n}" for n in range(DOCSTRING_LIMIT))
    (tmp_path / "termgym" / "c.py").write_text(f'"""{exact}"""\n\nX = "{"x" * (LINE_LIMIT - 6)}"\n')
    assert prose_overruns(tmp_path) == (["termgym/b.py:3"], ["termgym/a.py:1 module", "termgym/a.py:24 A"])


MODULE_LIMIT = 500  # lines: a module a reader can hold (issue 46)


def long_modules(root: Path) -> list[str]:
    """The library modules of ``root`` (a checkout) over ``MODULE_LIMIT`` lines, as ``path (lines)``."""
    found = []
    for path in module_files(root).values():
        lines = len(path.read_text().splitlines())
        if lines > MODULE_LIMIT:
            found.append(f"{path.relative_to(root)} ({lines})")
    return found


def test_no_library_module_is_over_500_lines(tmp_path: Path):
    assert long_modules(REPO_ROOT) == [], f"split these modules by job: {long_modules(REPO_ROOT)}"
    (tmp_path / "termgym").mkdir()
    (tmp_path / "termgym" / "a.py").write_text("x = 1\n" * (MODULE_LIMIT + 1))
    (tmp_path / "termgym" / "b.py").write_text("x = 1\n" * MODULE_LIMIT)
    assert long_modules(tmp_path) == [f"termgym/a.py ({MODULE_LIMIT + 1})"]
