"""Token ids, lists and tensors previewed on one line, as torch prints a tensor: ``[151644, 872, 198, ..., 198]``.

The first and last `EDGE` items of a long sequence, ``...`` between them; a 2-D tensor as its first and last
rows, each so cut. Used by ``show`` (a payload's tensors and lists) and ``show --text`` (the ids of a sample
without a tokenizer). numpy is imported only when a tensor or an array is previewed, torch never: a torch
tensor is read through its ``numpy()`` view.
"""

from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence

__all__ = ["EDGE", "inline", "inline_array", "is_scalar"]

EDGE = 3
_TEXT_CHARS = 24


def is_scalar(value: Any) -> bool:
    """A value shown inline as it is: a number, a bool, a short string, None."""
    return value is None or isinstance(value, (bool, int, float, str))


def _item(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return str(value) if -(10 ** 18) < value < 10 ** 18 else f"int of {value.bit_length()} bits"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        text = f"{value:.4g}"
        return text if any(c in text for c in ".en") else text + ".0"  # 3.0 reads as a float, as torch shows it
    if isinstance(value, str):
        return repr(value if len(value) <= _TEXT_CHARS else value[:_TEXT_CHARS] + "…")
    return type(value).__name__


def _cut(items: Sequence[Any], edge: int) -> List[Any]:
    return list(items) if len(items) <= 2 * edge + 1 else [*items[:edge], ..., *items[-edge:]]


def inline(items: Sequence[Any], *, edge: int = EDGE) -> str:
    """``[a, b, c, ..., x, y, z]``: the first and last `edge` of `items` (all of them when few)."""
    return "[" + ", ".join("..." if v is ... else _item(v) for v in _cut(items, edge)) + "]"


def _numbers(array: Any) -> Optional[Any]:
    """`array` (a torch tensor or a numpy array) as a numpy array of numbers, or None (no numeric view)."""
    import numpy as np  # only when a tensor or array is shown

    if type(array).__module__.split(".")[0] == "torch":
        try:
            if array.is_nested or array.is_complex():
                return None
            if array.dtype.is_floating_point and array.element_size() < 4:  # bfloat16, float16, float8: no numpy
                array = array.float()
            array = array.detach().cpu().numpy()
        except (RuntimeError, TypeError, ValueError, AttributeError):
            return None
    if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
        return None
    return array


def inline_array(array: Any, *, edge: int = EDGE, rows_apart: bool = False) -> Optional[str]:
    """A torch tensor or numpy array on one line: a vector as `inline`, a matrix as its first and last rows
    (with `rows_apart`, one a line, as torch prints them), more dimensions flattened; None when it holds no
    numbers to show (strings, complex, nested)."""
    values = _numbers(array)
    if values is None:
        return None
    if values.ndim == 0:
        return _item(values.item())
    if values.ndim == 2 and len(values) > 0:
        rows = list(values) if len(values) <= 2 else [values[0], ..., values[-1]]
        return "[" + (",\n " if rows_apart else ", ").join("..." if r is ... else _row(r, edge) for r in rows) + "]"
    return _row(values.reshape(-1), edge)


def _row(row: Any, edge: int) -> str:
    """One 1-D numpy row, only its edges converted to Python numbers (a row of a million ids costs six)."""
    if len(row) <= 2 * edge + 1:
        return inline(row.tolist(), edge=edge)
    return "[" + ", ".join([*map(_item, row[:edge].tolist()), "...", *map(_item, row[-edge:].tolist())]) + "]"
