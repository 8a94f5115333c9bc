"""Print the module table of docs/architecture.md: every module of the tree, its layer (as
tests/test_layers.py assigns it) and the first sentence of its docstring.

    .venv/bin/python scripts/module_table.py > /tmp/table.md   # then paste it over the table

tests/test_architecture.py checks that the page names exactly the modules of the tree.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.test_layers import LAYERS, layer_of, module_files  # noqa: E402


def first_sentence(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    end = text.find(". ")
    sentence = text if end < 0 else text[: end + 1]
    return sentence.replace("|", "\\|") or "(no docstring)"


def main() -> None:
    rows = sorted(module_files(ROOT).items(), key=lambda item: (layer_of(item[0]), item[0]))
    print("| module | layer | what it does |")
    print("|---|---|---|")
    for name, path in rows:
        print(f"| `{name}` | {LAYERS[layer_of(name)][0]} | {first_sentence(path)} |")


if __name__ == "__main__":
    main()
