"""Every ```python block in docs/*.md and README.md runs, so the docs cannot drift from the code.

Blocks of one file run in order in one namespace, in a fresh temporary working directory.
A block fenced as ```text, ```console or ```yaml is shown, not run.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text(encoding="utf-8"))


def test_docs_folder_has_runnable_examples():
    assert sum(len(python_blocks(p)) for p in DOCS) >= 5


@pytest.mark.parametrize("doc", [p for p in DOCS if python_blocks(p)], ids=lambda p: p.name)
def test_doc_examples_run(doc: Path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": f"docs_{doc.stem}"}
    for number, block in enumerate(python_blocks(doc), 1):
        code = compile(block, f"{doc.name}[block {number}]", "exec")
        exec(code, namespace)  # the docs are ours; running them is the point of this test
