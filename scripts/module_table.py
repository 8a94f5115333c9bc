"""Print the module table of docs/architecture.md: every module of the tree, its layer (as
tests/test_layers.py assigns it) and the first sentence of its docstring.

    .venv/bin/python scripts/module_table.py           # print it
    .venv/bin/python scripts/module_table.py --write   # replace the table in docs/architecture.md

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


HEADER = "| module | layer | what it does |"


def table() -> list[str]:
    rows = sorted(module_files(ROOT).items(), key=lambda item: (layer_of(item[0]), item[0]))
    lines = [HEADER, "|---|---|---|"]
    lines += [f"| `{name}` | {LAYERS[layer_of(name)][0]} | {first_sentence(path)} |" for name, path in rows]
    return lines


def write(page: Path) -> None:
    """Replace the table in ``page`` (from its header row to the last row after it)."""
    lines = page.read_text().splitlines()
    start = lines.index(HEADER)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    page.write_text("\n".join([*lines[:start], *table(), *lines[end:]]) + "\n")


def main() -> None:
    if sys.argv[1:] == ["--write"]:
        write(ROOT / "docs" / "architecture.md")
    else:
        print("\n".join(table()))


if __name__ == "__main__":
    main()
