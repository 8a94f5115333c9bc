"""The trainer's modules import one another without a circle, counting the imports made only for
types (``if TYPE_CHECKING:``), which ``tests/test_layers.py`` leaves out of its graph: a type-only
import is still a dependency a reader has to follow, and a circle through one is a layering that
only works by luck (the data types live in ``trainer/trajectory.py``, below everything that makes
or reads them, for this reason)."""

from __future__ import annotations

import ast

from tests.helpers import REPO_ROOT
from tests.test_layers import cycles, module_files

TRAINER = "termgym.trainer"


def every_import(path) -> set[str]:
    """Every module name an ``import`` statement of ``path`` names, type-only ones included (a
    ``from X import Y`` counts as ``X.Y`` too, which matters when Y is a submodule)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def trainer_graph() -> dict[str, set[str]]:
    modules = {name: path for name, path in module_files(REPO_ROOT).items() if name.startswith(TRAINER)}
    return {name: (every_import(path) & modules.keys()) - {name} for name, path in modules.items()}


def test_no_import_circle_in_the_trainer_even_through_type_only_imports():
    graph = trainer_graph()
    assert cycles(graph) == []
    assert "termgym.trainer.trajectory" in graph["termgym.trainer.batch"]  # where batch -> rollout closed one


def test_a_type_only_circle_is_found():
    graph = trainer_graph()
    graph["termgym.trainer.trajectory"].add("termgym.trainer.rollout")  # rollout imports trajectory
    assert cycles(graph) != []
