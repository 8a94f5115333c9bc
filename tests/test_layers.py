"""The import rules of docs/architecture.md, read from the code's own imports: each layer imports
only its own and the ones below; sandboxes import neither the task loader nor the episode layer;
verifiers do no I/O; nothing in termgym/ imports the trainer; no import cycles anywhere.

Imports are read from the source (every ``import`` statement, inside functions and under ``if
TYPE_CHECKING:`` too), with the installed names: ``verifiers/`` is ``termgym.verifiers``,
``trainer/`` is ``termgym.trainer``, ``envs/`` is ``termgym.envs``."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

# folder of the checkout -> the package name it installs as
PACKAGES = {
    "termgym": "termgym",
    "verifiers": "termgym.verifiers",
    "trainer": "termgym.trainer",
    "envs": "termgym.envs",
}
TASK_DIRS = ("archives", "file-ops", "shell-scripting", "text-processing")  # envs/: task data, not code

# bottom to top; a module may import its own layer and those below it. Each entry is a package
# (it and every module under it) or a module; every module of the checkout must be named by one:
# a module no entry names is a violation (``violations``), never filed under a layer by default.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("errors", ("termgym.errors",)),
    ("verifiers", ("termgym.verifiers",)),
    ("utilities", ("termgym.output", "termgym.aio", "termgym.progress", "termgym.tracking")),
    ("images", ("termgym.images",)),
    ("sandboxes", ("termgym.sandboxes",)),
    ("tasks", ("termgym.tasks", "termgym.envs")),
    (
        "episode",
        (
            "termgym.episode",
            "termgym.env",
            "termgym.trial",
            "termgym.records",
            "termgym.gym_env",
            "termgym.transcript",
            "termgym.atif",
            "termgym.atif_rules",
        ),
    ),
    ("agents", ("termgym.agents",)),
    ("harnesses", ("termgym.gateway", "termgym.integrations")),
    ("scheduling", ("termgym.scheduling",)),
    ("audit", ("termgym.audit",)),
    ("cli", ("termgym.cli", "termgym.__main__")),
    ("trainer", ("termgym.trainer",)),
]
# Named exactly, not as a package: the package's face (termgym/__init__.py: the environment, its
# errors and tasks, for ``import termgym``), which would otherwise name every module under it.
EXACT: dict[str, str] = {"termgym": "episode"}
SANDBOX_MAY_IMPORT = ("termgym.errors", "termgym.output", "termgym.aio", "termgym.images", "termgym.sandboxes")
VERIFIERS_MAY_IMPORT = ("termgym.verifiers", "termgym.errors")
IO_MODULES = {
    "os",
    "io",
    "pathlib",
    "shutil",
    "subprocess",
    "socket",
    "tempfile",
    "asyncio",
    "glob",
    "urllib",
    "http",
    "requests",
    "sqlite3",
    "tarfile",
    "zipfile",
    "docker",
    "daytona",
}
IO_CALLS = {"open", "print", "input"}


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def module_files(root: Path) -> dict[str, Path]:
    """Every project module under ``root`` (a checkout) by its installed dotted name."""
    modules = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root / folder)
            if folder == "envs" and relative.parts[0] in TASK_DIRS:
                continue
            parts = [*package.split("."), *relative.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The absolute names ``name`` imports (a submodule when ``from X import Y`` names one), the
    imports made only for types (``if TYPE_CHECKING:``) included: a type-only import is still a
    dependency a reader has to follow, and a circle through one works only by luck."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each project module's imports of other project modules."""
    modules = module_files(root)
    return {
        name: {i for i in imports_of(name, path, modules) if i in modules and i != name}
        for name, path in modules.items()
    }


class NoLayer(LookupError):
    """A module that no entry of ``LAYERS`` (or ``EXACT``) names."""


def layer_of(name: str) -> int:
    """The index in ``LAYERS`` of the layer that names ``name`` (the longest entry that does);
    ``NoLayer`` when none does."""
    if name in EXACT:
        return next(i for i, (layer, _) in enumerate(LAYERS) if layer == EXACT[name])
    named = [prefix for _, prefixes in LAYERS for prefix in prefixes if _under(name, prefix)]
    if not named:
        raise NoLayer(f"{name}: no layer names it (tests/test_layers.py LAYERS)")
    best = max(named, key=len)
    return next(i for i, (_, prefixes) in enumerate(LAYERS) if best in prefixes)


def violations(root: Path) -> list[str]:
    """Every broken rule in the checkout at ``root``, one line each."""
    modules = module_files(root)
    graph = import_graph(root)
    found = []
    for name in sorted(modules):
        try:
            layer_of(name)
        except NoLayer as exc:
            found.append(str(exc))
    if found:
        return found  # the import rules cannot be checked for a module without a layer
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            if layer_of(target) > layer_of(name):
                found.append(f"{name} ({LAYERS[layer_of(name)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})")
            if _under(name, "termgym.sandboxes") and not any(_under(target, p) for p in SANDBOX_MAY_IMPORT):
                found.append(f"{name} imports {target}: sandboxes import only {', '.join(SANDBOX_MAY_IMPORT)}")
            if _under(name, "termgym.verifiers") and not any(_under(target, p) for p in VERIFIERS_MAY_IMPORT):
                found.append(f"{name} imports {target}: verifiers import only {', '.join(VERIFIERS_MAY_IMPORT)}")
            if not _under(name, "termgym.trainer") and _under(target, "termgym.trainer"):
                found.append(f"{name} imports {target}: nothing outside the trainer imports it")
    for name, path in sorted(modules.items()):
        if _under(name, "termgym.verifiers"):
            tree = ast.parse(path.read_text())
            for module in sorted(imports_of(name, path, modules)):
                if module.split(".")[0] in IO_MODULES:
                    found.append(f"{name} imports {module}: verifiers do no I/O")
            for node in ast.walk(tree):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in IO_CALLS:
                    found.append(f"{name} calls {node.func.id}() on line {node.lineno}: verifiers do no I/O")
    found += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph)]
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [[*component, component[0]] for component in components]


def test_the_checkout_keeps_every_import_rule():
    assert module_files(REPO_ROOT)["termgym.verifiers.select"] == REPO_ROOT / "verifiers" / "select.py"
    assert violations(REPO_ROOT) == []


def test_every_module_is_in_a_layer():
    for name in module_files(REPO_ROOT):
        assert layer_of(name) >= 0, name


def test_a_new_module_no_layer_names_is_reported(checkout: Path):
    """A module added at the top of the package, or as a new package, must be given a layer: it
    is never filed under one silently (once, the bare prefix ``termgym`` named every module)."""
    (checkout / "termgym" / "newcomer.py").write_text("from termgym.errors import ConfigError\n")
    (checkout / "termgym" / "fresh").mkdir()
    (checkout / "termgym" / "fresh" / "__init__.py").write_text("")
    found = violations(checkout)
    assert "termgym.newcomer: no layer names it (tests/test_layers.py LAYERS)" in found
    assert "termgym.fresh: no layer names it (tests/test_layers.py LAYERS)" in found
    with pytest.raises(NoLayer):
        layer_of("termgym.newcomer")


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    """A copy of the checkout's code, to break on purpose."""
    for folder in PACKAGES:
        shutil.copytree(REPO_ROOT / folder, tmp_path / folder, ignore=shutil.ignore_patterns("__pycache__", *TASK_DIRS))
    assert violations(tmp_path) == []
    return tmp_path


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + f"\n\ndef _added():\n    {line}\n")


@pytest.mark.parametrize(
    ("module", "line", "expected"),
    [
        ("termgym/sandboxes/docker/sandbox.py", "from termgym.env import EnvOptions", "sandboxes import only"),
        ("termgym/sandboxes/base.py", "from termgym.tasks import Task", "sandboxes import only"),
        ("termgym/env.py", "import termgym.trainer.ppo", "nothing outside the trainer imports it"),
        ("termgym/cli/__init__.py", "from termgym.trainer.cli import main", "nothing outside the trainer imports it"),
        ("verifiers/ctrf.py", "from termgym.output import terminal_safe", "verifiers import only"),
        ("verifiers/tap.py", "import pathlib", "verifiers do no I/O"),
        ("verifiers/junit.py", "open('/etc/passwd')", "verifiers do no I/O"),
        (
            "termgym/images/build.py",
            "from termgym.scheduling import bias",
            "(images) imports termgym.scheduling.bias (scheduling)",
        ),
        ("trainer/losses.py", "from termgym.trainer.ppo import train", "import cycle"),
    ],
)
def test_a_forbidden_import_is_reported(checkout: Path, module: str, line: str, expected: str):
    _append(checkout / module, line)
    found = violations(checkout)
    assert any(expected in v for v in found), found


def test_an_import_needed_only_for_types_is_an_edge_too(checkout: Path):
    """Under ``if TYPE_CHECKING:`` an import still breaks the layers, or closes a circle (as
    ``trainer/batch.py`` once did through the rollout's ``Trajectory``)."""
    base = checkout / "termgym" / "sandboxes" / "base.py"
    base.write_text(
        base.read_text() + "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from termgym.tasks import Task\n"
    )
    batch = checkout / "trainer" / "batch.py"
    batch.write_text(
        batch.read_text()
        + "\nfrom typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from termgym.trainer.rollout import PolicyRunner\n"
    )
    found = violations(checkout)
    assert any("termgym.sandboxes.base imports termgym.tasks" in v for v in found), found
    assert any(v.startswith("import cycle:") and "termgym.trainer.batch" in v for v in found), found
