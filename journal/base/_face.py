"""A package's public face, imported on first use (PEP 562).

A face's ``__init__.py`` names its public names once, as imports under ``if TYPE_CHECKING:`` (what the type
checker and a reader see) and in ``__all__``; `lazy_face` reads that block and imports each name from its
module the first time it is asked for, so importing a package runs none of its modules (a private module
``stepjournal.sharing._pull`` imports ``stepjournal.sharing`` first, and the command line's light verbs never
load torch or numpy). tests/unit/test_faces.py checks that each face's ``__all__`` is its block's names.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Dict, List, Tuple


def face_imports(source: str) -> Dict[str, Tuple[str, str]]:
    """``{name: (module, attribute)}`` of the ``from MODULE import ...`` lines under the source's
    top-level ``if TYPE_CHECKING:`` (`module` as written, with its leading dots)."""
    import ast  # on the first lazy name only: `import stepjournal` stays as light as it was

    found: Dict[str, Tuple[str, str]] = {}
    for node in ast.parse(source).body:
        if not (isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"):
            continue
        for line in node.body:
            if isinstance(line, ast.ImportFrom):
                module = "." * line.level + (line.module or "")
                for alias in line.names:
                    found[alias.asname or alias.name] = (module, alias.name)
    return found


def lazy_face(namespace: Dict[str, Any]) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the package whose globals are `namespace`."""
    package = namespace["__name__"]
    where: Dict[str, Tuple[str, str]] = {}

    def __getattr__(name: str) -> Any:
        if not where:
            with open(namespace["__file__"], encoding="utf-8") as source:
                where.update(face_imports(source.read()))
        if name not in where:
            raise AttributeError(
                f"module {package!r} has no attribute {name!r}: its public names are {package}.__all__; errors are "
                "in stepjournal.errors, the shared words in stepjournal.vocabulary (docs/architecture.md, "
                '"The public face")', name=name, obj=sys.modules.get(package))
        module, attribute = where[name]
        value = getattr(importlib.import_module(module, package), attribute)
        # Cached in the package's own globals, so the next read is a plain attribute.
        namespace[name] = value
        return value

    def __dir__() -> List[str]:
        return sorted(set(namespace) | set(namespace["__all__"]))

    return __getattr__, __dir__
