"""The project's Python (tests, tools, scripts): every file compiles, and no line is longer than
120 columns, the width the code is written to."""

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
