"""docs/architecture.md and the tree agree: its module table names every module of the checkout,
each once, in the layer tests/test_layers.py gives it, and no module that is not there
(``scripts/module_table.py`` prints the table afresh)."""

from __future__ import annotations

import re

from tests.helpers import REPO_ROOT
from tests.test_layers import LAYERS, layer_of, module_files

ROW = re.compile(r"^\| `(termgym[\w.]*)` \| (\w+) \|", re.M)


def test_the_architecture_page_names_every_module_in_its_layer():
    page = (REPO_ROOT / "docs" / "architecture.md").read_text()
    rows = ROW.findall(page)
    named = [name for name, _ in rows]
    assert len(named) == len(set(named)), "a module named twice"
    modules = set(module_files(REPO_ROOT))
    assert sorted(modules - set(named)) == [], "modules the page does not name"
    assert sorted(set(named) - modules) == [], "modules the page names that the tree lacks"
    wrong = [(name, layer) for name, layer in rows if LAYERS[layer_of(name)][0] != layer]
    assert wrong == [], "modules in another layer than the page says"
