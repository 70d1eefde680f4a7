"""The journal's one converter as a seam for the rooms above: structure plain data into an attrs class.

The engine's config (`stepjournal.policies.EngineConfig`) is read from a mapping with the same
converter the events use, so one set of hooks structures everything; the converter itself stays the
journal's.
"""

from __future__ import annotations

from typing import Any, Type, TypeVar

from ._convert import converter

__all__ = ["structure"]

T = TypeVar("T")


def structure(data: Any, cls: Type[T]) -> T:
    """`data` (plain dicts, lists, scalars) as an instance of `cls`, by the journal's converter.

    Raises:
        cattrs.BaseValidationError: `data` does not fit `cls` (cattrs' grouped errors, for the caller
            to word: `cattrs.transform_error`).
    """
    return converter.structure(data, cls)
