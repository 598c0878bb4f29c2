"""The project's Python (tests, tools, scripts): every file compiles, no line is longer than
120 columns, the width the code is written to, and no module defines a top-level function or class
twice (the later one silently replaces the first: pytest would never run the first test)."""

import ast
import collections
import os
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("GEPARD_SOURCE_DIR") or Path(__file__).resolve().parents[2])
MAX_COLUMNS = 120
FILES = sorted(p for folder in ("scripts", "tests", "tools") for p in (SOURCE_DIR / folder).rglob("*.py"))


def test_files_found():
    assert len(FILES) > 30


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(SOURCE_DIR)))
def test_style(path):
    text = path.read_text(encoding="utf-8")
    compile(text, str(path), "exec")
    long = [i for i, line in enumerate(text.split("\n"), 1) if len(line) > MAX_COLUMNS]
    assert not long, f"{path.name}: lines {long} are longer than {MAX_COLUMNS} columns"
    defined = collections.Counter(node.name for node in ast.parse(text).body
                                  if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))
    twice = sorted(name for name, count in defined.items() if count > 1)
    assert not twice, f"{path.name}: {twice} defined more than once at the top level"
