"""What a test file starts beyond its own process, read from its source: the one place the tiers and
the parallel run learn it.

A file that starts a Ray cluster, an accelerate launch or verl's V1 harness (by itself or through a
support module it imports) is an end-to-end file: it must carry the ``e2e`` marker (tests/test_tiers.py
checks), and under ``pytest -n`` it runs in the one worker group that holds such runs, so two of them
never share the machine's cluster ports and cores at once (tests/conftest.py).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import List, Set

# What an end-to-end run starts, as its source spells it.
STARTS = {
    "a Ray cluster": re.compile(r"\bray\.init\(|\bcluster_utils\b|\bray start\b"),
    "an accelerate launch": re.compile(r"\baccelerate launch\b|\baccelerate-launch\b|\bnotebook_launcher\b"),
    "verl's V1 harness": re.compile(r"\bverl_v1_harness\b"),
}


def local_imports(path: Path, folder: Path) -> Set[Path]:
    """The modules of `folder` that the file at `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        found.update(folder / f"{name.split('.')[0]}.py" for name in names)
    return {p for p in found if p.is_file()}


def starts(path: Path, folder: Path) -> List[str]:
    """What the test file starts, by itself or through the support modules it imports (transitively)."""
    seen: Set[Path] = set()
    todo = [path]
    found = set()
    while todo:
        here = todo.pop()
        if here in seen:
            continue
        seen.add(here)
        text = here.read_text(encoding="utf-8")
        found.update(what for what, pattern in STARTS.items() if pattern.search(text))
        todo.extend(local_imports(here, folder))
    return sorted(found)


def marked_e2e(path: Path) -> bool:
    """Whether the module sets ``pytestmark`` to (a list holding) ``pytest.mark.e2e``."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return any(isinstance(n, ast.Attribute) and n.attr == "e2e" and isinstance(n.value, ast.Attribute)
                       and n.value.attr == "mark" for n in ast.walk(node.value))
    return False
