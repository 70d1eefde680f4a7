"""Structural comparison of two decoded payload values, with tolerances: what `diff` reports per pair.

Tensors and numpy arrays are compared by shape, dtype and values, with vectorised torch / numpy
operations (never a Python loop over elements); containers (dicts, lists, tuples, object arrays)
item by item, naming the first differing path (``responses[12]``, ``meta_info.temperature``).

Closeness is symmetric, as in `math.isclose`: ``|a - b| <= atol + rtol * max(|a|, |b|)``. NaN equals
NaN only where both values are NaN at the same place; NaN against a number differs, whatever the
tolerance. Integer, bool and string values are exact unless a per-field tolerance names them.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, TypedDict

import attrs

from ..payloads._codec_registry import CodecRegistry, default_registry
from ._tolerance import EXACT, Tolerance, Tolerances

# numpy and torch are bound by `compare_values`, at its first call, not at import: the report's types and
# a diff whose digests all agree (no payload loaded) need neither, and torch's import is most of a second.
# Every function below that uses them runs inside a comparison.
if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import torch
else:
    np = torch = None

__all__ = [
    "Difference",
    "Comparison",
    "compare_values",
    "EQUAL",
    "WITHIN_TOLERANCE",
    "DIFFERING",
]

EQUAL, WITHIN_TOLERANCE, DIFFERING = "equal", "within_tolerance", "differing"
# How many differing leaves a comparison lists (it counts them all).
_MAX_LISTED = 20
_SHORT = 60


@attrs.frozen
class Difference:
    """One place where two values part (or only come close).

    Attributes:
        path: where, e.g. ``responses[12]``, ``batch.old_log_probs``, ``meta_info.temperature``
            (empty for the whole value).
        state: `WITHIN_TOLERANCE` or `DIFFERING`.
        kind: ``values`` (numbers apart), ``shape``, ``dtype``, ``type``, ``keys``, ``length``.
        detail: the difference in words.
        shape_a, shape_b, dtype_a, dtype_b: of tensors and arrays.
        n_differing: elements that are not equal; n_outside: of those, outside the tolerance;
            n_elements: elements compared.
        max_abs, max_rel: largest absolute and relative error (``|a-b| / max(|a|,|b|)``).
        position: the first differing element (outside the tolerance when any is): its index.
        value_a, value_b: the values there (short text).
        atol, rtol: the tolerance applied.
    """

    path: str
    state: str
    kind: str
    detail: str
    shape_a: Optional[Tuple[int, ...]] = None
    shape_b: Optional[Tuple[int, ...]] = None
    dtype_a: Optional[str] = None
    dtype_b: Optional[str] = None
    n_elements: Optional[int] = None
    n_differing: Optional[int] = None
    n_outside: Optional[int] = None
    max_abs: Optional[float] = None
    max_rel: Optional[float] = None
    position: Optional[Tuple[int, ...]] = None
    value_a: Optional[str] = None
    value_b: Optional[str] = None
    atol: Optional[float] = None
    rtol: Optional[float] = None

    def brief(self) -> str:
        """A short phrase: ``sample 12: 0.0 vs 1.0``, ``responses[3]: 'ab' vs 'ac'``, ``shape [2] vs [3]``."""
        where = self.path
        if self.position is not None and self.kind == "values":
            pos = _position_text(self.position)
            where = f"{where} {pos}" if where else pos
        if self.value_a is not None or self.value_b is not None:
            text = f"{self.value_a} vs {self.value_b}"
        else:
            text = self.detail
        return f"{where}: {text}" if where else text

    def to_json(self) -> Dict[str, Any]:
        row = attrs.asdict(self)
        for key in ("shape_a", "shape_b", "position"):
            if row[key] is not None:
                row[key] = list(row[key])
        for key in ("max_abs", "max_rel", "atol", "rtol"):
            row[key] = json_float(row[key])
        return row


class _Meta(TypedDict):
    """The shapes and dtypes of two tensors or arrays: the `Difference` fields every finding about them carries."""

    shape_a: Tuple[int, ...]
    shape_b: Tuple[int, ...]
    dtype_a: str
    dtype_b: str


def _position_text(position: Tuple[int, ...]) -> str:
    if len(position) == 1:
        return f"sample {position[0]}"
    if len(position) == 2:
        return f"sample {position[0]}, token {position[1]}"
    return f"sample {position[0]}, token {position[1]}, at {list(position[2:])}"


def json_float(value: Optional[float]) -> Any:
    """A float for JSON: nan and inf as strings (JSON has neither)."""
    if value is None or math.isfinite(value):
        return value
    return repr(float(value))


@attrs.frozen
class Comparison:
    """The structural comparison of two values.

    Attributes:
        state: `EQUAL`, `WITHIN_TOLERANCE` or `DIFFERING`.
        differences: the first differing (or only close) places, in traversal order (at most 20).
        n_differences: how many places there are in all.
        max_abs: the largest absolute error over every compared number (None when none differ).
    """

    state: str
    differences: Tuple[Difference, ...] = ()
    n_differences: int = 0
    max_abs: Optional[float] = None

    @property
    def first(self) -> Optional[Difference]:
        """The first place outside the tolerance, else the first close one."""
        for d in self.differences:
            if d.state == DIFFERING:
                return d
        return self.differences[0] if self.differences else None

    def to_json(self) -> Dict[str, Any]:
        return {
            "state": self.state,
            "n_differences": self.n_differences,
            "max_abs": json_float(self.max_abs),
            "differences": [d.to_json() for d in self.differences],
        }


class _ValueWalk:
    """One comparison: walks both values side by side, collecting differences and the paths seen."""

    def __init__(self, tolerances: Tolerances, registry: CodecRegistry) -> None:
        self.tol = tolerances
        self.registry = registry
        self.found: List[Difference] = []
        self.count = 0
        self.worst = False
        self.max_abs: Optional[float] = None
        self.seen: set = set()

    def add(self, diff: Difference) -> None:
        self.count += 1
        self.worst = self.worst or diff.state == DIFFERING
        if diff.max_abs is not None:
            self.max_abs = diff.max_abs if self.max_abs is None else max(self.max_abs, diff.max_abs)
        if len(self.found) < _MAX_LISTED:
            self.found.append(diff)

    def value(self, a: Any, b: Any, path: str, names: Tuple[str, ...]) -> None:
        self.seen.add(names)
        a, b = self.unwrap(a), self.unwrap(b)
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return self.tensor(a, b, path, names)
        if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
            if a.dtype == object or b.dtype == object:
                return self.object_array(a, b, path, names)
            return self.array(a, b, path, names)
        if type(a) is not type(b):
            return self.add(Difference(path, DIFFERING, "type", f"{_type(a)} vs {_type(b)}",
                                       value_a=_type(a), value_b=_type(b)))
        if isinstance(a, dict):
            return self.mapping(a, b, path, names)
        if isinstance(a, (list, tuple)):
            return self.sequence(a, b, path, names)
        if isinstance(a, str):
            return self.string(a, b, path)
        if _is_number(a):
            return self.number(a, b, path, names)
        if not _same(a, b):
            self.add(Difference(path, DIFFERING, "values", "values differ", value_a=_short(a), value_b=_short(b)))

    def unwrap(self, value: Any) -> Any:
        """A value of a registered custom type, as its codec stores it (what the digest covers)."""
        codec = self.registry.codec_for(type(value))
        return value if codec is None else codec.encode(value)

    def mapping(self, a: dict, b: dict, path: str, names: Tuple[str, ...]) -> None:
        keys_a, keys_b = list(a), list(b)
        for key in keys_a:
            child = _key_path(path, key)
            child_names = names + (key,) if isinstance(key, str) else names
            if key in b:
                self.value(a[key], b[key], child, child_names)
            else:
                self.seen.add(child_names)
                self.add(Difference(child, DIFFERING, "keys", "only in A", value_a=_short(a[key]), value_b="(missing)"))
        for key in keys_b:
            if key not in a:
                child_names = names + (key,) if isinstance(key, str) else names
                self.seen.add(child_names)
                self.add(Difference(_key_path(path, key), DIFFERING, "keys", "only in B",
                                    value_a="(missing)", value_b=_short(b[key])))

    def sequence(self, a: Sequence[Any], b: Sequence[Any], path: str, names: Tuple[str, ...]) -> None:
        if len(a) != len(b):
            self.add(Difference(path, DIFFERING, "length", f"length {len(a)} vs {len(b)}"))
        for i in range(min(len(a), len(b))):
            x, y = a[i], b[i]
            if x is y or (type(x) is str and type(y) is str and x == y):
                continue
            self.value(x, y, f"{path}[{i}]", names)

    def object_array(self, a: np.ndarray, b: np.ndarray, path: str, names: Tuple[str, ...]) -> None:
        if a.dtype != b.dtype:
            self.add(Difference(path, DIFFERING, "dtype", f"dtype {a.dtype} vs {b.dtype}",
                                dtype_a=str(a.dtype), dtype_b=str(b.dtype), shape_a=a.shape, shape_b=b.shape))
            return
        if a.shape != b.shape:
            self.add(Difference(path, DIFFERING, "shape", f"shape {list(a.shape)} vs {list(b.shape)}",
                                shape_a=a.shape, shape_b=b.shape))
            return
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        for i in range(flat_a.size):
            x, y = flat_a[i], flat_b[i]
            if x is y or (type(x) is str and type(y) is str and x == y):
                continue
            index = np.unravel_index(i, a.shape) if a.ndim > 1 else (i,)
            self.value(x, y, f"{path}[{', '.join(str(int(j)) for j in index)}]", names)

    def string(self, a: str, b: str, path: str) -> None:
        if a == b:
            return
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        self.add(Difference(path, DIFFERING, "values", f"strings differ from character {at}",
                            position=None, value_a=_short(a), value_b=_short(b)))

    def number(self, a: Any, b: Any, path: str, names: Tuple[str, ...]) -> None:
        if _same(a, b):
            return
        exact_kind = not (_is_float(a) or _is_float(b))
        tol = self.tol.for_value(names, getattr(a, "dtype", "float64"), exact_kind)
        try:
            x, y = complex(a), complex(b)
            err = abs(x - y)
            scale = max(abs(x), abs(y))
        except (TypeError, ValueError, OverflowError):
            err, scale = float("inf"), 0.0
        if err != err:  # nan against a number
            err = float("inf")
        close = err != float("inf") and err <= tol.atol + tol.rtol * scale
        self.add(Difference(
            path, WITHIN_TOLERANCE if close else DIFFERING, "values",
            f"{_short(a)} vs {_short(b)}", n_elements=1, n_differing=1, n_outside=0 if close else 1,
            max_abs=float(err), max_rel=float(err / scale) if scale else None,
            value_a=_short(a), value_b=_short(b), atol=tol.atol, rtol=tol.rtol,
        ))

    def tensor(self, a: torch.Tensor, b: torch.Tensor, path: str, names: Tuple[str, ...]) -> None:
        meta = _Meta(shape_a=tuple(a.shape), shape_b=tuple(b.shape), dtype_a=str(a.dtype), dtype_b=str(b.dtype))
        if a.shape != b.shape:
            return self.add(Difference(path, DIFFERING, "shape", f"shape {list(a.shape)} vs {list(b.shape)}", **meta))
        if a.dtype != b.dtype:
            return self.add(Difference(path, DIFFERING, "dtype", f"dtype {a.dtype} vs {b.dtype}", **meta))
        exact_kind = not (a.dtype.is_floating_point or a.dtype.is_complex)
        tol = self.tol.for_value(names, a.dtype, exact_kind)
        try:
            # numpy's kernels on the same memory (no copy): its equality and nonzero scans ran 4-6x
            # faster than torch's on CPU here. Dtypes numpy lacks (bfloat16, float8 ...) stay in torch.
            na, nb = a.numpy(), b.numpy()
        except (TypeError, RuntimeError):
            pass  # a dtype numpy lacks: compared in torch below
        else:
            if not np.array_equal(na, nb):
                self.elementwise(na, nb, tol, path, meta, torch_ops=False)
            return
        try:
            if torch.equal(a, b):
                return
        except (RuntimeError, TypeError, NotImplementedError):
            pass  # no comparison kernel for this dtype: the bytes are compared below
        try:
            if a.dtype.is_floating_point and a.element_size() < 4:
                a, b = a.to(torch.float32), b.to(torch.float32)  # bf16, fp16, fp8: no loss, more kernels
            self.elementwise(a, b, tol, path, meta, torch_ops=True)
        except (RuntimeError, TypeError, NotImplementedError):
            # Dtypes without arithmetic (bits8, uint4 ...): compare their bytes, exactly.
            width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
            self.elementwise(a.view(width), b.view(width), EXACT, path, meta, torch_ops=True)

    def array(self, a: np.ndarray, b: np.ndarray, path: str, names: Tuple[str, ...]) -> None:
        meta = _Meta(shape_a=a.shape, shape_b=b.shape, dtype_a=str(a.dtype), dtype_b=str(b.dtype))
        if a.shape != b.shape:
            return self.add(Difference(path, DIFFERING, "shape", f"shape {list(a.shape)} vs {list(b.shape)}", **meta))
        if a.dtype != b.dtype:
            return self.add(Difference(path, DIFFERING, "dtype", f"dtype {a.dtype} vs {b.dtype}", **meta))
        if a.dtype.kind in "mM":  # datetimes: compare their int64 counts (NaT equals NaT)
            a, b = a.view(np.int64), b.view(np.int64)
        numeric = a.dtype.kind in "fc"
        if np.array_equal(a, b):  # NaNs make it False: `elementwise` then finds them equal
            return
        tol = self.tol.for_value(names, a.dtype, not numeric)
        self.elementwise(a, b, tol, path, meta, torch_ops=False)

    def elementwise(self, a: Any, b: Any, tol: Tolerance, path: str, meta: _Meta, torch_ops: bool) -> None:
        """Count, measure and locate the differing elements of two same-shape arrays, vectorised."""
        lib = torch if torch_ops else np
        flat_a, flat_b = a.reshape(-1), b.reshape(-1)
        # One pass finds the differing elements; everything after works on those alone, so a pair
        # that parts in one token of a million costs that pass and a handful of values.
        idx: Any  # the differing positions: a torch tensor or a numpy array, as `torch_ops` says
        if torch_ops:
            floating = a.dtype.is_floating_point or a.dtype.is_complex
            measurable = a.dtype != torch.bool
            idx = torch.nonzero(flat_a != flat_b).reshape(-1)
        else:
            floating = a.dtype.kind in "fc"
            measurable = a.dtype.kind in "iufc"
            idx = np.flatnonzero(flat_a != flat_b)
        x, y = flat_a[idx], flat_b[idx]
        if floating:  # NaN != NaN: where both are NaN they are equal
            keep = ~(lib.isnan(x) & lib.isnan(y))
            idx, x, y = idx[keep], x[keep], y[keep]
        n_diff = int(idx.shape[0])
        if n_diff == 0:
            return
        max_abs = max_rel = None
        n_out, first = n_diff, int(idx[0])
        if measurable:
            with np.errstate(invalid="ignore", over="ignore"):  # inf - inf, inf / inf: handled below
                if not floating:
                    x = x.to(torch.float64) if torch_ops else x.astype(np.float64)
                    y = y.to(torch.float64) if torch_ops else y.astype(np.float64)
                err = lib.abs(x - y)
                err[lib.isnan(err)] = float("inf")  # NaN against a number: no tolerance covers it
                scale = lib.maximum(lib.abs(x), lib.abs(y))
                # NaN or inf against another value is outside any tolerance (its bound would be nan or inf).
                outside = ~(err <= tol.atol + tol.rtol * scale) | lib.isinf(err)
                max_abs = float(err.max())
                nonzero = scale > 0
                rel = err[nonzero] / scale[nonzero]
                rel[lib.isnan(rel)] = float("inf")  # an infinity against another value
                max_rel = float(rel.max()) if bool(nonzero.any()) else None
            n_out = int(outside.sum())
            if n_out:
                first = int(idx[outside][0])
        position = tuple(int(i) for i in np.unravel_index(first, tuple(a.shape))) if a.ndim else ()
        value_a, value_b = _element(a, position), _element(b, position)
        state = DIFFERING if n_out else WITHIN_TOLERANCE
        n_total = int(np.prod(tuple(a.shape), dtype=np.int64))
        beyond = f", {n_out} beyond tolerance" if n_out else ", all within tolerance"
        detail = f"{n_diff} of {n_total} elements differ{beyond}"
        self.add(Difference(
            path, state, "values", detail, **meta, n_elements=n_total, n_differing=n_diff, n_outside=n_out,
            max_abs=max_abs, max_rel=max_rel, position=position or None, value_a=value_a, value_b=value_b,
            atol=tol.atol, rtol=tol.rtol,
        ))


def _element(array: Any, position: Tuple[int, ...]) -> str:
    item = array[position] if position else array[()]
    single = str(array.dtype).replace("torch.", "") in ("float32", "float16", "bfloat16", "complex64")
    if isinstance(item, (torch.Tensor, np.generic)):
        item = item.item()
    if single and isinstance(item, float):
        text = f"{item:.8g}"  # every digit a float32 holds, not the float64 expansion of it
        return text if any(c in text for c in ".eni") else text + ".0"
    return _short(item)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float, complex, np.number, np.bool_))


def _is_float(value: Any) -> bool:
    return isinstance(value, (float, complex, np.floating, np.complexfloating))


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN (both NaN at the same place)."""
    if type(a) is not type(b) and (isinstance(a, bool) or isinstance(b, bool)):
        return False
    try:
        if a == b:
            return True
    except Exception:  # a custom value's __eq__ may refuse
        return False
    return _is_float(a) and _is_float(b) and a != a and b != b


def _type(value: Any) -> str:
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _short(value: Any) -> str:
    if isinstance(value, float):
        text = repr(value)
    elif isinstance(value, (torch.Tensor, np.ndarray)):
        text = f"{type(value).__name__} {list(value.shape)}"
    else:
        text = repr(value)
    return text if len(text) <= _SHORT else text[: _SHORT - 1] + "…"


def _key_path(path: str, key: Any) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]"


def _import_tensor_libraries() -> None:
    global np, torch
    if torch is None:
        import numpy
        import torch as imported_torch

        np, torch = numpy, imported_torch


def compare_values(
    a: Any,
    b: Any,
    tolerances: Optional[Tolerances] = None,
    *,
    registry: Optional[CodecRegistry] = None,
) -> Tuple[Comparison, set]:
    """Compare two decoded payload values structurally.

    Args:
        a, b: the values (what `Journal.load` returns).
        tolerances: overall, per-field and per-dtype tolerances (default: the per-dtype defaults).
        registry: where custom types are looked up; a value of a registered type is compared as its
            codec stores it. `default_registry` when None.

    Returns:
        The `Comparison`, and the set of key paths seen (tuples of dict keys), to check that every
        per-field tolerance named something.
    """
    _import_tensor_libraries()
    walk = _ValueWalk(tolerances or Tolerances(), default_registry if registry is None else registry)
    walk.value(a, b, "", ())
    if walk.count == 0:
        state = EQUAL
    else:
        state = DIFFERING if walk.worst else WITHIN_TOLERANCE
    return Comparison(state, tuple(walk.found), walk.count, walk.max_abs), walk.seen
