"""The tolerances of a diff: overall, per field and per dtype, and which one a value gets.

Closeness is symmetric, as in `math.isclose`: ``|a - b| <= atol + rtol * max(|a|, |b|)``. Integer,
bool and string values are exact unless a per-field tolerance names them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

import attrs

if TYPE_CHECKING:  # pragma: no cover - names for the annotations only: a diff that loads no payload imports no torch
    import numpy as np
    import torch

__all__ = ["Tolerance", "Tolerances", "DTYPE_TOLERANCES", "EXACT"]


@attrs.frozen
class Tolerance:
    """How far two numbers may be apart and still count as equal: ``|a-b| <= atol + rtol*max(|a|,|b|)``."""

    atol: float = 0.0
    rtol: float = 0.0

    @property
    def exact(self) -> bool:
        return self.atol == 0.0 and self.rtol == 0.0


EXACT = Tolerance()

# Per-dtype defaults: those of `torch.testing.assert_close`, which absorb the rounding of a reduction
# summed in another order (another GPU, another batch split, another kernel): a few units in the last
# place of each format. float32: eps 1.2e-7, so rtol 1.3e-6 is about 11 ulps; bfloat16 keeps 8
# significant bits (eps 7.8e-3), so rtol 1.6e-2 is 2 ulps. Python floats count as float64. Integer
# and bool dtypes (token ids, masks) and strings are exact: one token off is a different rollout.
DTYPE_TOLERANCES: Mapping[str, Tolerance] = {
    "float64": Tolerance(atol=1e-7, rtol=1e-7),
    "float32": Tolerance(atol=1e-5, rtol=1.3e-6),
    "float16": Tolerance(atol=1e-5, rtol=1e-3),
    "bfloat16": Tolerance(atol=1e-5, rtol=1.6e-2),
    "float8": Tolerance(atol=1e-3, rtol=0.125),
    "complex128": Tolerance(atol=1e-7, rtol=1e-7),
    "complex64": Tolerance(atol=1e-5, rtol=1.3e-6),
    "complex32": Tolerance(atol=1e-5, rtol=1e-3),
}


def _dtype_key(dtype: Union[torch.dtype, np.dtype]) -> str:
    name = str(dtype).replace("torch.", "")
    return "float8" if name.startswith("float8") else name


def _field_map(fields: Mapping[str, Tolerance]) -> Dict[str, Tolerance]:
    """The per-field tolerances as a dict of their own, so the caller's mapping can change without changing them."""
    return dict(fields)


@attrs.frozen
class Tolerances:
    """The tolerances of one diff: overall, per field and per dtype.

    Attributes:
        atol, rtol: overall tolerance for floating-point values; both None means the per-dtype
            defaults (`DTYPE_TOLERANCES`); one given means the other is 0.
        fields: field path -> `Tolerance`. A field is a dotted path of dict keys (list and array
            indices left out); it names every value whose path holds it as a run of keys
            (``old_log_probs`` names ``batch.old_log_probs``; ``batch`` names all of ``batch``). The
            longest matching field wins. A per-field tolerance applies to integers too.
    """

    atol: Optional[float] = None
    rtol: Optional[float] = None
    fields: Mapping[str, Tolerance] = attrs.field(factory=dict, converter=_field_map)

    def __attrs_post_init__(self) -> None:
        for value in (self.atol, self.rtol, *(t for f in self.fields.values() for t in (f.atol, f.rtol))):
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"tolerance {value!r} is not a finite number >= 0")
        for name in self.fields:
            if not name or any(not part for part in name.split(".")):
                raise ValueError(f"tolerance field {name!r} is not a dotted path of keys (e.g. batch.old_log_probs)")

    def _field(self, names: Tuple[str, ...]) -> Optional[Tuple[str, Tolerance]]:
        best = None
        for name, tol in self.fields.items():
            parts = tuple(name.split("."))
            if _holds_run(names, parts) and (best is None or len(parts) > len(best[0].split("."))):
                best = (name, tol)
        return best

    def for_value(self, names: Tuple[str, ...], dtype: Any, exact_kind: bool) -> Tolerance:
        """The tolerance of a value at `names` (its dict-key path) of `dtype`; exact kinds are exact."""
        found = self._field(names) if self.fields else None
        if found is not None:
            return found[1]
        if exact_kind:
            return EXACT
        if self.atol is not None or self.rtol is not None:
            return Tolerance(self.atol or 0.0, self.rtol or 0.0)
        return DTYPE_TOLERANCES.get(_dtype_key(dtype), EXACT)

    def unused(self, seen: Iterable[Tuple[str, ...]]) -> List[str]:
        """The fields that name no path in `seen`."""
        seen = list(seen)
        return [f for f in self.fields if not any(_holds_run(names, tuple(f.split("."))) for names in seen)]


def _holds_run(names: Tuple[str, ...], parts: Tuple[str, ...]) -> bool:
    n = len(parts)
    return any(names[i : i + n] == parts for i in range(len(names) - n + 1))
