"""What a test file starts beyond its own process, read from its source: the one place the tiers and
the parallel run learn it.

A file that starts a Ray cluster, an accelerate launch or verl's V1 harness (by itself or through a
support module it imports) is an end-to-end file: it must carry the ``e2e`` marker and live in
``tests/e2e/``, and under ``pytest -n`` it runs in the one worker group that holds such runs, so two of
them never share the machine's cluster ports and cores at once (tests/conftest.py). A file that starts
a process or a server lives in ``tests/integration/``; the rest, in one process, in ``tests/unit/``.
tests/unit/test_tiers.py checks each file against these rules.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path
from typing import Dict, List, Set, Tuple

# What an end-to-end run starts, as its source spells it.
STARTS = {
    "a Ray cluster": re.compile(r"\bray\.init\(|\bcluster_utils\b|\bray start\b"),
    "an accelerate launch": re.compile(r"\baccelerate launch\b|\baccelerate-launch\b|\bnotebook_launcher\b"),
    "verl's V1 harness": re.compile(r"\bverl_v1_harness\b"),
}


def _read(path: Path) -> Tuple[str, ast.Module]:
    """The text of the file at `path` and its syntax tree, read and parsed once while the file is unchanged."""
    stat = path.stat()
    return _parsed(path, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=None)
def _parsed(path: Path, _mtime_ns: int, _size: int) -> Tuple[str, ast.Module]:
    text = path.read_text(encoding="utf-8")
    return text, ast.parse(text)


def local_imports(path: Path, folder: Path) -> Set[Path]:
    """The modules of `folder` that the file at `path` imports, anywhere in it."""
    found = set()
    for node in ast.walk(_read(path)[1]):
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
        text = _read(here)[0]
        found.update(what for what, pattern in STARTS.items() if pattern.search(text))
        todo.extend(local_imports(here, folder))
    return sorted(found)


def marked_e2e(path: Path) -> bool:
    """Whether the module sets ``pytestmark`` to (a list holding) ``pytest.mark.e2e``."""
    for node in _read(path)[1].body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return any(isinstance(n, ast.Attribute) and n.attr == "e2e" and isinstance(n.value, ast.Attribute)
                       and n.value.attr == "mark" for n in ast.walk(node.value))
    return False


CLUSTER_GROUP = "cluster"


def worker_group(path: Path, tests: Path) -> str:
    """The group of a test file under ``pytest -n``: the cluster group for a file that starts a cluster-wide
    run, else the file's own path."""
    return CLUSTER_GROUP if starts(path, tests) else str(path)


# What a test file does beyond its own process, as its own code names it (text in strings does not
# count; a support module that only parses is fine to import): a unit file uses none of these.
SPAWNS = {"subprocess", "multiprocessing", "pty", "Popen", "os.fork", "start_moto", "s3_server", "region_server",
          "redirect_server", "run_cli", "run_line"}


def spawns(path: Path) -> List[str]:
    """The names of `SPAWNS` that the code of the file at `path` uses (imports, names, attributes, arguments)."""
    used = set()
    for node in ast.walk(_read(path)[1]):
        if isinstance(node, ast.Import):
            used.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            used.update([(node.module or "").split(".")[0], *(a.name for a in node.names)])
        elif isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.arg):
            used.add(node.arg)
        elif isinstance(node, ast.Attribute):
            used.add(node.attr)
            if isinstance(node.value, ast.Name):
                used.add(f"{node.value.id}.{node.attr}")
    return sorted(used & SPAWNS)


# The folders of the tiers, under tests/: what runs in one process; what starts processes or servers;
# what starts a cluster, a launch, a trainer or a benchmark (the `e2e` marker, left out by `make test-fast`).
TIERS = ("unit", "integration", "e2e")


def imported_tests(path: Path) -> List[str]:
    """The test modules (``test_*``) the file at `path` imports."""
    names = set()
    for node in ast.walk(_read(path)[1]):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module)
    return sorted(n for n in names if n.startswith("test_"))


def misplaced(tests: Path) -> Dict[str, str]:
    """The test files under `tests` that are not in their tier's folder, or import a test module of another
    folder, and the shared helpers that import a test module, each with why."""
    found = {}
    for path in sorted(tests.rglob("test_*.py")):
        name = str(path.relative_to(tests))
        tier = path.parent.name if path.parent.parent == tests else None
        if tier not in TIERS:
            found[name] = "is in no tier's folder (tests/unit, tests/integration, tests/e2e)"
        elif marked_e2e(path) != (tier == "e2e"):
            found[name] = "is marked e2e outside tests/e2e" if tier != "e2e" else "is in tests/e2e without the e2e marker"
        elif stray := [module for module in imported_tests(path) if not (path.parent / f"{module}.py").is_file()]:
            found[name] = f"imports {', '.join(stray)}, not a test module of its folder: shared helpers go in a tests/ module"
        elif tier == "unit" and spawns(path):
            found[name] = f"starts a process or a server ({', '.join(spawns(path))}): it belongs in tests/integration"
    for path in sorted(tests.glob("*.py")):
        if imported_tests(path):
            found[path.name] = (f"is a shared helper that imports {', '.join(imported_tests(path))}: what it needs of "
                                "a test module goes in a tests/ module")
    return found
