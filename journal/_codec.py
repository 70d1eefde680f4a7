"""Pickle-free payload codec: Python values, torch tensors and numpy arrays to bytes and back.

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

import math
import re
import struct
import threading
import warnings
from collections.abc import Callable
from typing import Any

import attrs
import msgpack
import numpy as np
import torch

from ._errors import PayloadDecodeError, UnknownCodecError, UnsupportedValueError

__all__ = [
    "FORMAT_VERSION",
    "MAX_DEPTH",
    "PAYLOAD_MAGIC",
    "CodecRegistry",
    "decode_payload",
    "decode_payload_releasing",
    "default_registry",
    "describe_payload",
    "encode_payload",
    "encode_payload_array",
    "register_codec",
]

PAYLOAD_MAGIC = b"SJP\x01"
FORMAT_VERSION = 1
# Containers nested deeper than this are refused on both sides. msgpack itself refuses to pack more
# than 511 levels, and one level costs one Python frame in each direction, so stay well below both.
MAX_DEPTH = 256

_PREFIX = struct.Struct("<4sB3sQ")
_ALIGN = 64
_MAX_NDIM = 64  # numpy's limit; torch's is the same
_MAX_DIM = (1 << 63) - 1
_INT_MIN = -(1 << 63)
_INT_MAX = (1 << 64) - 1
_STR_PREVIEW = 80
_NAT = np.array(np.datetime64("NaT")).tobytes()

_LIST, _TUPLE, _DICT, _BIGINT, _TENSOR, _NDARRAY, _OBJARRAY, _NPSCALAR, _EXT = range(9)
_NUMPY_KINDS = frozenset("biufcmMUS")
# Byte order, kind, item size, optional datetime unit: all that a dtype.str of an allowed kind holds.
_NUMPY_DTYPE_RE = re.compile(r"[<>|][biufcmMUS][0-9]{1,9}(?:\[[0-9]{0,9}[A-Za-z]{1,3}\])?")
_DEFAULT_MAX_ITEMS = 100


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


_TORCH_DTYPES = _torch_dtypes()
_TORCH_DTYPE_NAMES = {dtype: name for name, dtype in _TORCH_DTYPES.items()}
# Tensors are copied as integers of the same width: bit exact (no float canonicalisation), and it
# works for the dtypes (float8, uint4, bits8...) that have no copy kernel of their own.
_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _numpy_dtype(name: object) -> np.dtype | None:
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


def _is_native_type(type_: type) -> bool:
    """Say whether the codec stores instances of exactly this type without a registered codec."""
    if type_ in (type(None), bool, int, float, str, bytes, list, tuple, dict, torch.Tensor, np.ndarray):
        return True
    return issubclass(type_, np.generic) and type_.__module__ == "numpy"


@attrs.frozen
class _Codec:
    type_: type
    name: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


class CodecRegistry:
    """Codecs for custom types, each under a stable name that payloads store instead of code.

    Lookup is by exact type: a subclass of a registered type needs its own registration.
    """

    def __init__(self) -> None:
        self._by_type: dict[type, _Codec] = {}
        self._by_name: dict[str, _Codec] = {}
        self._lock = threading.Lock()

    def register(
        self,
        type_: type,
        name: str,
        *,
        encode: Callable[[Any], Any],
        decode: Callable[[Any], Any],
    ) -> None:
        """Register a codec for `type_` under `name`.

        Args:
            type_: the exact class whose instances the codec stores.
            name: a stable name such as "verl.DataProto"; payloads store it, so never reuse it.
            encode: turns an instance into a value this codec can store (dicts, tensors, ...).
            decode: turns that value back into an instance.

        Raises:
            ValueError: `name` is taken by another type, `type_` already has another name, or
                `type_` is one the codec stores natively. Registering the same pair again is a no-op.
            TypeError: an argument has the wrong type.
        """
        if not isinstance(type_, type):
            raise TypeError(f"register needs a class, got {type_!r}")
        if type(name) is not str or not name or name != name.strip():
            raise TypeError(f"codec name must be a non-empty string without surrounding spaces, got {name!r}")
        if not callable(encode) or not callable(decode):
            raise TypeError("encode and decode must be callables")
        if _is_native_type(type_):
            raise ValueError(f"{_type_name(type_)} is stored natively by stepjournal; it cannot take a codec")
        with self._lock:
            by_name = self._by_name.get(name)
            by_type = self._by_type.get(type_)
            if by_name is not None and by_name is by_type:
                return
            if by_name is not None:
                raise ValueError(
                    f"codec name {name!r} is already registered for {_type_name(by_name.type_)}; "
                    "pick another name"
                )
            if by_type is not None:
                raise ValueError(
                    f"{_type_name(type_)} already has a codec named {by_type.name!r}; "
                    "a type has exactly one name"
                )
            codec = _Codec(type_, name, encode, decode)
            self._by_type[type_] = codec
            self._by_name[name] = codec

    def copy(self) -> CodecRegistry:
        """Return a new registry holding the same codecs, to extend without touching this one."""
        other = CodecRegistry()
        with self._lock:
            other._by_type = dict(self._by_type)
            other._by_name = dict(self._by_name)
        return other

    def __contains__(self, name: object) -> bool:
        return name in self._by_name


default_registry = CodecRegistry()


def register_codec(
    type_: type,
    name: str,
    *,
    encode: Callable[[Any], Any],
    decode: Callable[[Any], Any],
) -> None:
    """Register a codec for `type_` in the default registry; see `CodecRegistry.register`."""
    default_registry.register(type_, name, encode=encode, decode=decode)


# ---------------------------------------------------------------------------------------------
# Encoding

# A path is None for the root, else (parent path, key, how): "key" for dict keys, "index" for
# sequence positions, "flat" for (flat index, shape) in object arrays. Strings are built only for
# error messages, so the hot path pays one small tuple per value.
_Path = tuple | None


def _type_name(type_: type) -> str:
    module = type_.__module__
    return type_.__qualname__ if module == "builtins" else f"{module}.{type_.__qualname__}"


def _render_path(path: _Path) -> str:
    parts = []
    while path is not None:
        path, key, how = path
        parts.append((key, how))
    if not parts:
        return "<payload>"
    out = ""
    for key, how in reversed(parts):
        if how == "key" and type(key) is str:
            out = f"{out}.{key}" if out else key
        elif how == "flat":
            flat, shape = key
            index = np.unravel_index(flat, shape) if len(shape) > 1 else (flat,)
            out += "[" + ", ".join(str(int(i)) for i in index) + "]"
        elif how == "key":
            out += f"[{_r(key)}]"
        else:
            out += f"[{key}]"
    return out


def _unsupported(path: _Path, value: object, why: str = "") -> UnsupportedValueError:
    type_ = type(value)
    name = type_.__name__
    hint = (
        f"To store it, register a codec: stepjournal.register_codec({name}, \"mypackage.{name}\", "
        "encode=..., decode=...)"
    )
    if not why:
        why = (
            "payloads hold dict, list, tuple, str, bytes, int, float, bool, None, torch tensors, "
            "numpy arrays and numpy scalars, and types with a registered codec"
        )
        if isinstance(value, (dict, list, tuple)):
            why += "; subclasses (namedtuples too) are not turned into their base class silently"
    return UnsupportedValueError(f"cannot store {_type_name(type_)} at {_render_path(path)}: {why}. {hint}")


class _Encoder:
    """Walks a value once: builds the header tree and lays out the buffers it refers to."""

    def __init__(self, registry: CodecRegistry) -> None:
        self.by_type = registry._by_type
        self.buffers: list[tuple[int, int, torch.Tensor | np.ndarray]] = []
        self.size = 0
        # ids of the containers on the current descent, to refuse cycles instead of recursing.
        self.active: set[int] = set()

    def reserve(self, nbytes: int, source: torch.Tensor | np.ndarray) -> int:
        if nbytes == 0:
            return self.size
        offset = _align(self.size)
        self.size = offset + nbytes
        self.buffers.append((offset, nbytes, source))
        return offset

    def enter(self, value: object, path: _Path, depth: int) -> None:
        if depth >= MAX_DEPTH:
            raise _unsupported(path, value, f"containers nest deeper than {MAX_DEPTH} levels here")
        if id(value) in self.active:
            raise _unsupported(path, value, "it contains itself (a reference cycle); payloads must be trees")
        self.active.add(id(value))

    def node(self, value: Any, path: _Path, depth: int) -> Any:
        type_ = type(value)
        if type_ is str or type_ is float or type_ is bool or value is None or type_ is bytes:
            return value
        if type_ is int:
            if _INT_MIN <= value <= _INT_MAX:
                return value
            return [_BIGINT, value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)]
        if type_ is list or type_ is tuple:
            self.enter(value, path, depth)
            out: list[Any] = [_LIST if type_ is list else _TUPLE]
            for i, item in enumerate(value):
                out.append(self.node(item, (path, i, "index"), depth + 1))
            self.active.discard(id(value))
            return out
        if type_ is dict:
            self.enter(value, path, depth)
            out = [_DICT]
            for key, item in value.items():
                out.append(self.key(key, path, depth + 1))
                out.append(self.node(item, (path, key, "key"), depth + 1))
            self.active.discard(id(value))
            return out
        if type_ is torch.Tensor:
            return self.tensor(value, path)
        if type_ is np.ndarray:
            if value.dtype.kind == "O":
                return self.object_array(value, path, depth)
            dtype = value.dtype
            if _numpy_dtype(dtype.str) is None:
                why = f"numpy dtype {dtype} is not of kind b, i, u, f, c, m, M, U, S or O"
                raise _unsupported(path, value, why)
            return [_NDARRAY, dtype.str, list(value.shape), self.reserve(value.nbytes, value), value.nbytes]
        if (
            isinstance(value, np.generic)
            and value.dtype.type is type_
            and _numpy_dtype(value.dtype.str) is not None
        ):
            return [_NPSCALAR, value.dtype.str, value.tobytes()]
        codec = self.by_type.get(type_)
        if codec is not None:
            self.enter(value, path, depth)
            # The encoded form is walked like any value, so it may hold tensors or other custom types.
            inner = self.node(codec.encode(value), path, depth + 1)
            self.active.discard(id(value))
            return [_EXT, codec.name, inner]
        raise _unsupported(path, value)

    def key(self, key: Any, path: _Path, depth: int) -> Any:
        type_ = type(key)
        if type_ is str or type_ is float or type_ is bool or key is None or type_ is bytes or type_ is int:
            return self.node(key, path, depth)
        if type_ is tuple and depth < MAX_DEPTH:
            return [_TUPLE, *(self.key(part, path, depth + 1) for part in key)]
        raise UnsupportedValueError(
            f"cannot store the dict key {_r(key)} under {_render_path(path)}: keys must be str, int, float, "
            "bool, None, bytes, or tuples of these"
        )

    def tensor(self, value: torch.Tensor, path: _Path) -> list[Any]:
        name = _TORCH_DTYPE_NAMES.get(value.dtype)
        if name is None:
            raise _unsupported(path, value, f"{value.dtype} tensors are not plain bytes (quantized?)")
        if value.layout is not torch.strided or value.is_nested:
            why = f"only dense tensors are stored, this one is {value.layout}; call .to_dense() first"
            raise _unsupported(path, value, why)
        if value.device.type == "meta":
            raise _unsupported(path, value, "meta tensors have no data to store")
        nbytes = value.numel() * value.element_size()
        return [_TENSOR, name, list(value.shape), self.reserve(nbytes, value), nbytes]

    def object_array(self, value: np.ndarray, path: _Path, depth: int) -> list[Any]:
        self.enter(value, path, depth)
        shape = value.shape
        out: list[Any] = [_OBJARRAY, list(shape)]
        for i, item in enumerate(value.flat):
            out.append(self.node(item, (path, (i, shape), "flat"), depth + 1))
        self.active.discard(id(value))
        return out


def _write_tensor(out: bytearray, offset: int, nbytes: int, value: torch.Tensor) -> None:
    """Copy a tensor's bytes into `out` once, straight from its device, as C-contiguous bytes."""
    src = value.detach().resolve_conj().resolve_neg()
    width = _SAME_WIDTH_INT.get(src.element_size())
    if width is not None and src.device.type == "cpu" and src.is_contiguous():
        # The common case, a contiguous CPU tensor, is one memcpy through numpy. torch's copy_ splits
        # a large copy over its intra-op threads, which wait and spin for a busy core: on a loaded
        # 2-core machine that made an 86 MB copy take 2x longer than the single memcpy.
        np.frombuffer(out, dtype=np.uint8, count=nbytes, offset=offset)[:] = (
            src.view(width).reshape(-1).numpy().view(np.uint8)
        )
        return
    dst = torch.frombuffer(out, dtype=torch.uint8, count=nbytes, offset=offset)
    if width is None:  # 16-byte complex128: no integer that wide, and its own copy is exact.
        dst.view(src.dtype).view(src.shape).copy_(src)
    else:
        # copy_ lays out any strides (transposed, sliced, expanded) as C order in this one pass.
        dst.view(width).view(src.shape).copy_(src.view(width))


def encode_payload(value: Any, *, registry: CodecRegistry | None = None) -> bytearray:
    """Encode a value into a new payload buffer.

    Args:
        value: the value to store; see the module docstring for what is supported.
        registry: where custom types are looked up; `default_registry` when None.

    Returns:
        The payload, as one bytearray of its final size.

    Raises:
        UnsupportedValueError: some part of `value` cannot be stored; the message names its path.
            Errors raised by a registered encode function pass through unchanged.
    """
    return _encode(value, registry, bytearray)


def encode_payload_array(value: Any, *, registry: CodecRegistry | None = None) -> np.ndarray:
    """`encode_payload`, into a 1-D uint8 numpy array instead of a bytearray (same bytes).

    For the journal's record path: a bytearray is zero-filled in 4 KiB pages on allocation, which for a
    payload of tens of MB costs several times the copy that follows; numpy's allocation is left
    uninitialised and asks for transparent huge pages, and only the padding is zeroed here.
    """
    return _encode(value, registry, lambda size: np.empty(size, dtype=np.uint8))


def _encode(value: Any, registry: CodecRegistry | None, allocate: Callable[[int], Any]) -> Any:
    encoder = _Encoder(default_registry if registry is None else registry)
    try:
        tree = encoder.node(value, None, 0)
    except RecursionError:
        # Only reachable when the caller is already deep in the stack; MAX_DEPTH covers the rest.
        raise UnsupportedValueError(
            f"the value nests too deeply to store (limit {MAX_DEPTH} levels)"
        ) from None
    header = msgpack.packb(tree, use_bin_type=True, unicode_errors="surrogatepass")
    data_start = _align(_PREFIX.size + len(header))
    total = data_start + encoder.size
    out = allocate(total)
    view = memoryview(out).cast("B")
    _PREFIX.pack_into(view, 0, PAYLOAD_MAGIC, FORMAT_VERSION, b"\0\0\0", len(header))
    view[_PREFIX.size : _PREFIX.size + len(header)] = header
    # `out` may be uninitialised: every byte between the buffers (alignment padding) is written as zero.
    written = _PREFIX.size + len(header)
    for offset, nbytes, source in encoder.buffers:
        start = data_start + offset
        view[written:start] = bytes(start - written)
        if isinstance(source, torch.Tensor):
            _write_tensor(out, start, nbytes, source)
        else:
            # Assigning through a view of the right dtype and shape copies strided arrays in one pass.
            dst = np.frombuffer(out, dtype=np.uint8, count=nbytes, offset=start)
            dst.view(source.dtype).reshape(source.shape)[...] = source
        written = start + nbytes
    view[written:total] = bytes(total - written)
    view.release()
    return out


# ---------------------------------------------------------------------------------------------
# Decoding


def _bad(detail: str) -> PayloadDecodeError:
    return PayloadDecodeError(f"payload bytes are malformed: {detail}", detail=detail)


def _reject_ext(code: int, data: bytes) -> Any:
    raise _bad(f"msgpack ext type {code} in the header")


class _Reader:
    """Validates a payload's framing and walks its header, to decode or to describe it."""

    def __init__(
        self,
        data: bytes | bytearray | memoryview,
        registry: CodecRegistry,
        release: Callable[[int, int], None] | None = None,
    ) -> None:
        self.release = release
        try:
            view = memoryview(data).cast("B")
        except TypeError as exc:
            raise TypeError(
                f"payload must be bytes, bytearray or a contiguous memoryview, got {type(data).__name__}"
            ) from exc
        total = len(view)
        if total < _PREFIX.size:
            raise _bad(f"{total} bytes is shorter than the {_PREFIX.size}-byte prefix")
        magic, version, reserved, header_len = _PREFIX.unpack_from(view, 0)
        if magic != PAYLOAD_MAGIC:
            raise _bad(f"starts with {bytes(magic)!r}, not {PAYLOAD_MAGIC!r}; not a stepjournal payload")
        if version != FORMAT_VERSION:
            raise _bad(f"format version {version}; this stepjournal reads version {FORMAT_VERSION} (upgrade?)")
        if reserved != b"\0\0\0":
            raise _bad("reserved prefix bytes are not zero")
        if header_len > total - _PREFIX.size:
            raise _bad(f"header claims {header_len} bytes but only {total - _PREFIX.size} follow the prefix")
        self.data_start = _align(_PREFIX.size + header_len)
        if self.data_start > total:
            raise _bad("payload ends inside the header padding")
        self.data_size = total - self.data_start
        self.cursor = 0
        self.view = view
        self.registry = registry
        try:
            self.root = msgpack.unpackb(
                view[_PREFIX.size : _PREFIX.size + header_len],
                raw=False,
                use_list=True,
                strict_map_key=True,
                unicode_errors="surrogatepass",
                ext_hook=_reject_ext,
                max_str_len=header_len,
                max_bin_len=header_len,
                max_array_len=header_len,
                max_map_len=0,
                max_ext_len=0,
            )
        except PayloadDecodeError:
            raise
        except Exception as exc:
            raise _bad(f"header is not valid msgpack ({type(exc).__name__}: {exc})") from None

    # -- validation shared by decode and describe

    def claim(self, offset: object, nbytes: int) -> int:
        """Check a buffer lies inside the data section after the previous one; return its start."""
        if type(offset) is not int or offset < self.cursor or offset + nbytes > self.data_size:
            raise _bad(
                f"buffer at offset {_r(offset)} of {nbytes} bytes is outside the data section or overlaps another"
            )
        # Buffers may not overlap, so all allocations together stay within the input's size.
        self.cursor = offset + nbytes
        return self.data_start + offset

    @staticmethod
    def shape(raw: object, itemsize: int) -> tuple[tuple[int, ...], int]:
        """Validate a shape; return it and its element count."""
        if type(raw) is not list or len(raw) > _MAX_NDIM:
            raise _bad(f"shape {_r(raw)} is not a list of at most {_MAX_NDIM} sizes")
        for size in raw:
            if type(size) is not int or not 0 <= size <= _MAX_DIM:
                raise _bad(f"shape {_r(raw)} holds an invalid size")
        # numpy and torch refuse shapes whose sizes multiply past 2**63 even when one of them is 0.
        if math.prod(max(size, 1) for size in raw) * itemsize > _MAX_DIM:
            raise _bad(f"shape {_r(raw)} is too large")
        return tuple(raw), math.prod(raw)

    def buffer_spec(self, node: list[Any]) -> tuple[Any, tuple[int, ...], int, int]:
        """Validate a tensor or array node; return (dtype, shape, start in data, nbytes)."""
        if len(node) != 5:
            raise _bad("tensor or array node does not have 5 fields")
        _, name, raw_shape, offset, nbytes = node
        if node[0] == _TENSOR:
            dtype: Any = _TORCH_DTYPES.get(name) if type(name) is str else None
            itemsize = dtype.itemsize if dtype is not None else 0
        else:
            dtype = _numpy_dtype(name)
            itemsize = dtype.itemsize if dtype is not None else 0
        if dtype is None:
            raise _bad(f"unknown dtype {_r(name)}")
        shape, count = self.shape(raw_shape, itemsize)
        if type(nbytes) is not int or count * itemsize != nbytes:
            raise _bad(f"{_r(nbytes)} bytes do not hold shape {_r(list(shape))} of {name}")
        return dtype, shape, self.claim(offset, nbytes), nbytes

    def codec_name(self, node: list[Any]) -> str:
        if len(node) != 3 or type(node[1]) is not str:
            raise _bad("custom codec node does not have a name and a value")
        return node[1]

    def scalar_spec(self, node: list[Any]) -> tuple[np.dtype, bytes]:
        if len(node) != 3:
            raise _bad("numpy scalar node does not have 3 fields")
        dtype = _numpy_dtype(node[1])
        if dtype is None or type(node[2]) is not bytes or len(node[2]) != dtype.itemsize:
            raise _bad(f"numpy scalar of dtype {_r(node[1])} is malformed")
        # numpy only makes a scalar of a unitless datetime when it is NaT.
        if dtype.kind in "mM" and np.datetime_data(dtype)[0] == "generic" and node[2] != _NAT:
            raise _bad(f"numpy scalar of dtype {_r(node[1])} is not NaT")
        return dtype, node[2]

    def tag(self, node: Any, depth: int) -> int:
        if type(node) is not list or not node or type(node[0]) is not int:
            raise _bad(f"unexpected {type(node).__name__} in the header")
        # The encoder puts containers at depths below MAX_DEPTH, so a node may sit at MAX_DEPTH itself.
        if depth > MAX_DEPTH:
            raise _bad(f"header nests deeper than {MAX_DEPTH} levels")
        return node[0]

    def key(self, node: Any, depth: int) -> Any:
        """Decode a dict key: scalars and tuples of them only, so the result is always hashable."""
        type_ = type(node)
        if type_ is str or type_ is int or type_ is float or type_ is bool or type_ is bytes or node is None:
            return node
        tag = self.tag(node, depth)
        if tag == _TUPLE:
            return tuple(self.key(part, depth + 1) for part in node[1:])
        if tag == _BIGINT:
            return self.bigint(node)
        raise _bad(f"dict key node of kind {tag}")

    @staticmethod
    def bigint(node: list[Any]) -> int:
        if len(node) != 2 or type(node[1]) is not bytes:
            raise _bad("big int node is malformed")
        return int.from_bytes(node[1], "little", signed=True)

    # -- decode

    def decode(self, node: Any, depth: int) -> Any:
        type_ = type(node)
        if type_ is str or type_ is int or type_ is float or type_ is bool or type_ is bytes or node is None:
            return node
        tag = self.tag(node, depth)
        if tag == _LIST:
            return [self.decode(item, depth + 1) for item in node[1:]]
        if tag == _TUPLE:
            return tuple(self.decode(item, depth + 1) for item in node[1:])
        if tag == _DICT:
            if len(node) % 2 != 1:
                raise _bad("dict node has a key without a value")
            return {
                self.key(node[i], depth + 1): self.decode(node[i + 1], depth + 1)
                for i in range(1, len(node), 2)
            }
        if tag == _BIGINT:
            return self.bigint(node)
        if tag == _TENSOR:
            dtype, shape, start, nbytes = self.buffer_spec(node)
            # numpy, unlike torch's CPU allocator, asks the kernel for transparent huge pages on large
            # buffers: first-touch page faults of 4 KiB pages cost 4-5x the copy itself (86 MB: ~40 ms
            # against ~8 ms). The tensor owns the array; its storage is just not resizable.
            if not nbytes:
                return torch.empty(0, dtype=torch.uint8).view(dtype).reshape(shape)
            array = np.empty(nbytes, dtype=np.uint8)
            array[:] = np.frombuffer(self.view, dtype=np.uint8, count=nbytes, offset=start)
            if self.release is not None:
                self.release(start, start + nbytes)
            return torch.from_numpy(array).view(dtype).reshape(shape)
        if tag == _NDARRAY:
            dtype, shape, start, nbytes = self.buffer_spec(node)
            array = np.empty(shape, dtype=dtype)
            if nbytes:
                source = np.frombuffer(self.view, dtype=np.uint8, count=nbytes, offset=start)
                array.reshape(-1).view(np.uint8)[:] = source
                if self.release is not None:
                    self.release(start, start + nbytes)
            return array
        if tag == _OBJARRAY:
            if len(node) < 2:
                raise _bad("object array node has no shape")
            shape, count = self.shape(node[1], 8)
            if count != len(node) - 2:
                raise _bad(f"object array of shape {_r(list(shape))} holds {len(node) - 2} items")
            array = np.empty(count, dtype=object)
            for i in range(count):
                array[i] = self.decode(node[i + 2], depth + 1)
            return array.reshape(shape)
        if tag == _NPSCALAR:
            dtype, raw = self.scalar_spec(node)
            return np.frombuffer(raw, dtype=dtype, count=1)[0]
        if tag == _EXT:
            name = self.codec_name(node)
            codec = self.registry._by_name.get(name)
            if codec is None:
                raise UnknownCodecError(
                    f"payload holds a value of custom codec {_r(name)}, which is not registered in this "
                    f"process; import the adapter that registers it, or call "
                    f"stepjournal.register_codec(<type>, {_r(name)}, encode=..., decode=...) first",
                    detail=f"unknown codec {_r(name)}",
                )
            inner = self.decode(node[2], depth + 1)
            try:
                return codec.decode(inner)
            except PayloadDecodeError:
                raise
            except Exception as exc:
                why = f"codec {_r(name)} could not decode its value ({type(exc).__name__}: {exc})"
                raise _bad(why) from exc
        raise _bad(f"unknown node kind {tag}")

    # -- describe

    def describe(self, node: Any, depth: int, max_items: int | None) -> dict[str, Any]:
        type_ = type(node)
        if node is None:
            return {"kind": "none"}
        if type_ is bool:
            return {"kind": "bool", "value": node}
        if type_ is int:
            return _describe_int(node)
        if type_ is float:
            # JSON has no nan or inf; spell them as strings.
            return {"kind": "float", "value": node if math.isfinite(node) else repr(node)}
        if type_ is str:
            return {"kind": "str", "length": len(node), "value": _shorten(node)}
        if type_ is bytes:
            return {"kind": "bytes", "nbytes": len(node)}
        tag = self.tag(node, depth)
        if tag in (_LIST, _TUPLE):
            items = node[1:]
            return {
                "kind": "list" if tag == _LIST else "tuple",
                "length": len(items),
                "items": [self.describe(item, depth + 1, max_items) for item in _head(items, max_items)],
            }
        if tag == _DICT:
            if len(node) % 2 != 1:
                raise _bad("dict node has a key without a value")
            pairs = list(zip(node[1::2], node[2::2]))
            described = []
            for key, value in _head(pairs, max_items):
                decoded = self.key(key, depth + 1)
                described.append({
                    "key": _shorten(decoded) if type(decoded) is str else _r(decoded),
                    "value": self.describe(value, depth + 1, max_items),
                })
            return {"kind": "dict", "length": len(pairs), "items": described}
        if tag == _BIGINT:
            return _describe_int(self.bigint(node))
        if tag in (_TENSOR, _NDARRAY):
            dtype, shape, _, nbytes = self.buffer_spec(node)
            return {
                "kind": "tensor" if tag == _TENSOR else "ndarray",
                "dtype": node[1],
                "shape": list(shape),
                "nbytes": nbytes,
            }
        if tag == _OBJARRAY:
            if len(node) < 2:
                raise _bad("object array node has no shape")
            shape, count = self.shape(node[1], 8)
            if count != len(node) - 2:
                raise _bad(f"object array of shape {_r(list(shape))} holds {len(node) - 2} items")
            return {
                "kind": "object_array",
                "shape": list(shape),
                "items": [self.describe(item, depth + 1, max_items) for item in _head(node[2:], max_items)],
            }
        if tag == _NPSCALAR:
            dtype, raw = self.scalar_spec(node)
            scalar = np.frombuffer(raw, dtype=dtype, count=1)[0]
            return {"kind": "numpy_scalar", "dtype": node[1], "value": _shorten(str(scalar))}
        if tag == _EXT:
            name = self.codec_name(node)
            return {
                "kind": "ext",
                "name": name,
                "registered": name in self.registry,
                "value": self.describe(node[2], depth + 1, max_items),
            }
        raise _bad(f"unknown node kind {tag}")


def _shorten(text: str) -> str:
    return text if len(text) <= _STR_PREVIEW else text[: _STR_PREVIEW - 1] + "…"


def _r(value: object) -> str:
    """repr for messages about hostile input: bounded in length, and safe for ints of any size."""
    try:
        return _shorten(repr(value))
    except ValueError:  # ints past sys.get_int_max_str_digits() have no decimal repr
        return f"<{type(value).__name__}>"


def _describe_int(value: int) -> dict[str, Any]:
    # Very long ints have no decimal form within Python's default digit limit, and none is useful.
    if value.bit_length() <= 256:
        return {"kind": "int", "value": value}
    return {"kind": "int", "bits": value.bit_length(), "hex": _shorten(hex(value))}


def _head(items: list[Any], max_items: int | None) -> list[Any]:
    return items if max_items is None else items[:max_items]


def _read(
    data: bytes | bytearray | memoryview,
    registry: CodecRegistry | None,
    walk: Callable[[_Reader], Any],
    release: Callable[[int, int], None] | None = None,
) -> Any:
    reader = _Reader(data, default_registry if registry is None else registry, release)
    try:
        return walk(reader)
    except PayloadDecodeError:
        raise
    except Exception as exc:
        # Every check above is explicit; this net keeps the promise that hostile bytes raise only
        # PayloadDecodeError even where numpy or torch object to a value no check foresaw.
        raise _bad(f"{type(exc).__name__}: {exc}") from exc


def decode_payload(data: bytes | bytearray | memoryview, *, registry: CodecRegistry | None = None) -> Any:
    """Decode a payload made by `encode_payload`.

    The result shares no memory with `data`, so `data` may be a view that dies after the call.

    Args:
        data: the payload bytes.
        registry: where custom codec names are looked up; `default_registry` when None.

    Returns:
        The stored value, tensors on the CPU.

    Raises:
        UnknownCodecError: the payload holds a custom type whose codec is not registered.
        PayloadDecodeError: the bytes are not a well-formed payload, or a codec failed on them.
        TypeError: `data` is not bytes-like.
    """
    return _read(data, registry, lambda reader: reader.decode(reader.root, 0))


def decode_payload_releasing(
    data: memoryview, *, registry: CodecRegistry | None = None, release: Callable[[int, int], None] | None
) -> Any:
    """`decode_payload`, calling ``release(start, stop)`` on each tensor's or array's bytes of `data`
    right after they are copied out, so the journal can unmap an LMDB value's pages as it goes."""
    return _read(data, registry, lambda reader: reader.decode(reader.root, 0), release)


def describe_payload(
    data: bytes | bytearray | memoryview,
    *,
    registry: CodecRegistry | None = None,
    max_items: int | None = _DEFAULT_MAX_ITEMS,
) -> dict[str, Any]:
    """Describe a payload's structure as a JSON-able tree, without copying tensor bytes.

    Each node is a dict with a "kind": "none", "bool", "int" ("value"; past 256 bits "bits" and
    "hex" instead), "float" (nan/inf as strings), "str"
    (value cut to 80 characters, plus "length"), "bytes" ("nbytes"), "list"/"tuple"/"dict"/
    "object_array" ("length" or "shape", and "items"; dict items are {"key", "value"}), "tensor"/
    "ndarray" ("dtype", "shape", "nbytes"), "numpy_scalar" ("dtype", "value" as text) and "ext"
    ("name", "registered", "value"). No codec is run.

    Args:
        data: the payload bytes.
        registry: used only to report whether each custom codec name is registered.
        max_items: how many items of each container to describe; None for all.

    Raises:
        PayloadDecodeError: the bytes are not a well-formed payload.
    """
    return _read(data, registry, lambda reader: reader.describe(reader.root, 0, max_items))
