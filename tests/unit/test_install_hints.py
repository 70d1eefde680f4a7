"""Hints that work (issue 47 point 8): stepjournal is installed from a clone or a wheel, never by name from a
package index (where whatever holds the name would be installed). So no message, docstring or page tells the
user to ``pip install stepjournal[...]`` or ``pip install -U stepjournal``: a hint names the dependency that is
missing, pinned as the extra pins it, or the extra's install from a clone (``pip install -e '.[s3]'``)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = re.compile(r"pip3?\s+install\s+(?:-U\s+|--upgrade\s+)*[\"'`]*stepjournal\b|stepjournal\[", re.IGNORECASE)
PINNED = re.compile(r"pip install [\"']([A-Za-z0-9_.-]+[<>=!~][^\"']*)[\"']")


def sources() -> list[Path]:
    """The package's sources and its pages: every text a user reads a hint in."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for room in ("journal", "policies", "adapters"):
        found += sorted((ROOT / room).rglob("*.py"))
    return found


def test_no_hint_installs_stepjournal_by_name_from_an_index():
    bad = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in sources()
           for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if FORBIDDEN.search(line)]
    assert bad == []


def test_a_pinned_dependency_a_hint_names_is_pinned_as_an_extra_pins_it():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pinned = {requirement for listed in extras.values() for requirement in listed}
    named = {m.group(1) for path in sources() for m in PINNED.finditer(path.read_text(encoding="utf-8"))}
    assert named and named <= pinned, named - pinned
