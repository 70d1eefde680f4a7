"""The payload format: its layout, node tags, dtype allow-lists and limits (shared by encode and decode).

A payload is one contiguous buffer::

    offset 0   PAYLOAD_MAGIC (4 bytes, b"SJP\\x01")
    offset 4   u8 format version (FORMAT_VERSION), then 3 reserved bytes that must be zero
    offset 8   u64 little-endian length H of the header
    offset 16  header: msgpack, one tree of nodes (below)
               zero padding up to the next multiple of 64 bytes: the data section starts there
    data       raw buffers, each 64-byte aligned, in the order the header tree visits them

Header nodes. str, bytes, bool, None, float (float64, bit exact: nan payloads, inf, -0.0) and ints
in [-2**63, 2**64) are stored as the msgpack value itself. Every msgpack array is a node whose first
element is an integer tag; msgpack maps and ext types never appear:

    [0, item...]                        list
    [1, item...]                        tuple
    [2, key, value, key, value...]      dict, in insertion order
    [3, bytes]                          int outside the msgpack range, two's complement little-endian
    [4, dtype, shape, offset, nbytes]   torch tensor; dtype is str(torch.dtype), e.g. "torch.bfloat16"
    [5, dtype, shape, offset, nbytes]   numpy array; dtype is numpy's dtype.str, e.g. ">i4", "<M8[ns]"
    [6, shape, item...]                 numpy object array, items in C order
    [7, dtype, bytes]                   numpy scalar (np.int64(3), np.bool_(True), ...)
    [8, name, value]                    value of a registered custom type, as its codec encoded it

Buffer offsets are relative to the data section. Tensors and arrays are stored C-contiguous in host
byte order (little-endian on every platform torch supports); numpy arrays keep their own byte order.

What is kept and what is not: container types are exact (a tuple comes back a tuple), dict order is
kept, and tensors come back on the CPU, contiguous, with `requires_grad=False`; shared references
come back as separate copies. Subclasses of dict/list/tuple (namedtuples too), of torch.Tensor (such
as nn.Parameter) and of np.ndarray are refused rather than silently turned into their base class:
register a codec for them, or convert them first.

Decoding trusts nothing in the bytes: every length and offset is checked against the real data
before anything is allocated, buffers may not overlap, dtypes come from fixed allow-lists, nesting
is capped, and the only code that runs is the decode functions registered in this process. Decoded
values never reference the input buffer, which may be an LMDB view that dies after the call.
"""

from __future__ import annotations

import re
import struct
import warnings

import numpy as np
import torch

from ._payload_magic import PAYLOAD_MAGIC

# The format's one description, shared by the encoder and the decoder (and the registry's type names).
__all__ = [
    "PAYLOAD_MAGIC", "FORMAT_VERSION", "MAX_DEPTH", "PREFIX", "MAX_NDIM", "MAX_DIM", "INT_MIN", "INT_MAX", "NAT",
    "DEFAULT_MAX_ITEMS", "TORCH_DTYPES", "TORCH_DTYPE_NAMES", "SAME_WIDTH_INT",
    "TAG_LIST", "TAG_TUPLE", "TAG_DICT", "TAG_BIGINT", "TAG_TENSOR", "TAG_NDARRAY", "TAG_OBJARRAY", "TAG_NPSCALAR",
    "TAG_EXT", "align", "numpy_dtype", "is_native_type", "type_name", "shorten", "short_repr",
]

FORMAT_VERSION = 1
# Containers nested deeper than this are refused on both sides. msgpack itself refuses to pack more
# than 511 levels, and one level costs one Python frame in each direction, so stay well below both.
MAX_DEPTH = 256

PREFIX = struct.Struct("<4sB3sQ")
_ALIGN = 64
MAX_NDIM = 64  # numpy's limit; torch's is the same
MAX_DIM = (1 << 63) - 1
INT_MIN = -(1 << 63)
INT_MAX = (1 << 64) - 1
_STR_PREVIEW = 80
NAT = np.array(np.datetime64("NaT")).tobytes()

TAG_LIST, TAG_TUPLE, TAG_DICT, TAG_BIGINT, TAG_TENSOR, TAG_NDARRAY, TAG_OBJARRAY, TAG_NPSCALAR, TAG_EXT = range(9)
_NUMPY_KINDS = frozenset("biufcmMUS")
# Byte order, kind, item size, optional datetime unit: all that a dtype.str of an allowed kind holds.
_NUMPY_DTYPE_RE = re.compile(r"[<>|][biufcmMUS][0-9]{1,9}(?:\[[0-9]{0,9}[A-Za-z]{1,3}\])?")
DEFAULT_MAX_ITEMS = 100


def _torch_dtypes() -> dict[str, torch.dtype]:
    """Map the name of every torch dtype whose tensors are plain bytes to the dtype.

    Built from torch's own dtype objects, so decoding looks names up here instead of calling getattr
    on strings from the input. Quantized dtypes are left out: their values need a scale and zero
    point that raw bytes do not carry.
    """
    found: dict[str, torch.dtype] = {}
    # Probing complex32 and the quantized dtypes makes torch warn once; importing us should not.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for value in list(vars(torch).values()):
            if not isinstance(value, torch.dtype) or str(value) in found:
                continue
            try:
                probe = torch.empty(2, dtype=value)
                if probe.is_quantized:
                    continue
                probe.view(torch.uint8).view(value)
            except (RuntimeError, TypeError, NotImplementedError):
                continue
            found[str(value)] = value
    return found


TORCH_DTYPES = _torch_dtypes()
TORCH_DTYPE_NAMES = {dtype: name for name, dtype in TORCH_DTYPES.items()}
# Tensors are copied as integers of the same width: bit exact (no float canonicalisation), and it
# works for the dtypes (float8, uint4, bits8...) that have no copy kernel of their own.
SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def align(n: int) -> int:
    """`n` rounded up to the alignment of tensor data in a payload."""
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def numpy_dtype(name: object) -> np.dtype | None:
    """Return the numpy dtype `name` denotes if it is one a payload may hold, else None."""
    if type(name) is not str or _NUMPY_DTYPE_RE.fullmatch(name) is None:
        return None
    try:
        dtype = np.dtype(name)
    except (TypeError, ValueError):
        return None
    # Round-tripping through dtype.str rejects spellings numpy reads but never writes.
    if dtype.kind not in _NUMPY_KINDS or dtype.itemsize == 0 or dtype.str != name:
        return None
    return dtype


def is_native_type(type_: type) -> bool:
    """Say whether the codec stores instances of exactly this type without a registered codec."""
    if type_ in (type(None), bool, int, float, str, bytes, list, tuple, dict, torch.Tensor, np.ndarray):
        return True
    return issubclass(type_, np.generic) and type_.__module__ == "numpy"


def type_name(type_: type) -> str:
    """The name a payload records for a type: ``int``, ``numpy.float32``, ``verl.protocol.DataProto``."""
    module = type_.__module__
    return type_.__qualname__ if module == "builtins" else f"{module}.{type_.__qualname__}"


def shorten(text: str) -> str:
    """`text` cut to a message's preview length, with an ellipsis."""
    return text if len(text) <= _STR_PREVIEW else text[: _STR_PREVIEW - 1] + "…"


def short_repr(value: object) -> str:
    """repr for messages about hostile input: bounded in length, and safe for ints of any size."""
    try:
        return shorten(repr(value))
    except ValueError:  # ints past sys.get_int_max_str_digits() have no decimal repr
        return f"<{type(value).__name__}>"


