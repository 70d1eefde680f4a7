"""Encoding a value into a payload: walk it once, build the header, copy each tensor's bytes once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, List, Tuple

import msgpack
import numpy as np
import torch

from ..base._errors import UnsupportedValueError
from ._codec_format import (FORMAT_VERSION, INT_MAX, INT_MIN, MAX_DEPTH, PAYLOAD_MAGIC, PREFIX, SAME_WIDTH_INT,
                            TAG_BIGINT, TAG_DICT, TAG_EXT, TAG_LIST, TAG_NDARRAY, TAG_NPSCALAR, TAG_OBJARRAY,
                            TAG_TENSOR, TAG_TUPLE, TORCH_DTYPE_NAMES, align, numpy_dtype, short_repr, type_name)
from ._codec_registry import CodecRegistry, default_registry
from ..base._unstorable import storing_hint

__all__ = ["encode_payload", "encode_payload_array", "encode_payload_parts"]

# ---------------------------------------------------------------------------------------------
# Encoding

# A path is None for the root, else (parent path, key, how): "key" for dict keys, "index" for
# sequence positions, "flat" for (flat index, shape) in object arrays. Strings are built only for
# error messages, so the hot path pays one small tuple per value.
_Path = tuple | None



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
            out += f"[{short_repr(key)}]"
        else:
            out += f"[{key}]"
    return out


def _unsupported(
    path: _Path, value: object, why: str = "", base: tuple[type, Any] | None = None
) -> UnsupportedValueError:
    type_ = type(value)
    hint = storing_hint(value)
    if not why:
        why = (
            "payloads hold dict, list, tuple, str, bytes, int, float, bool, None, torch tensors, "
            "numpy arrays and numpy scalars, and types with a registered codec"
        )
        if isinstance(value, (dict, list, tuple)):
            why += "; subclasses (namedtuples too) are not turned into their base class silently"
        if base is not None:
            why += (
                f"; its base class {type_name(base[0])} has the codec {short_repr(base[1].name)}, but a subclass is "
                "not stored as its base (it would come back as one)"
            )
    return UnsupportedValueError(f"cannot store {type_name(type_)} at {_render_path(path)}: {why}. {hint}")


class _Encoder:
    """Walks a value once: builds the header tree and lays out the buffers it refers to."""

    def __init__(self, registry: CodecRegistry) -> None:
        self.codec_for = registry.codec_for
        self.buffers: list[tuple[int, int, torch.Tensor | np.ndarray]] = []
        self.size = 0
        # ids of the containers on the current descent, to refuse cycles instead of recursing.
        self.active: set[int] = set()

    def reserve(self, nbytes: int, source: torch.Tensor | np.ndarray) -> int:
        if nbytes == 0:
            return self.size
        offset = align(self.size)
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
            if INT_MIN <= value <= INT_MAX:
                return value
            return [TAG_BIGINT, value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)]
        if type_ is list or type_ is tuple:
            self.enter(value, path, depth)
            out: list[Any] = [TAG_LIST if type_ is list else TAG_TUPLE]
            for i, item in enumerate(value):
                out.append(self.node(item, (path, i, "index"), depth + 1))
            self.active.discard(id(value))
            return out
        if type_ is dict:
            self.enter(value, path, depth)
            out = [TAG_DICT]
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
            if numpy_dtype(dtype.str) is None:
                why = f"numpy dtype {dtype} is not of kind b, i, u, f, c, m, M, U, S or O"
                raise _unsupported(path, value, why)
            return [TAG_NDARRAY, dtype.str, list(value.shape), self.reserve(value.nbytes, value), value.nbytes]
        if (
            isinstance(value, np.generic)
            and value.dtype.type is type_
            and numpy_dtype(value.dtype.str) is not None
        ):
            return [TAG_NPSCALAR, value.dtype.str, value.tobytes()]
        codec = self.codec_for(type_)
        if codec is not None:
            self.enter(value, path, depth)
            # The encoded form is walked like any value, so it may hold tensors or other custom types.
            inner = self.node(codec.encode(value), path, depth + 1)
            self.active.discard(id(value))
            return [TAG_EXT, codec.name, inner]
        bases = ((base, self.codec_for(base)) for base in type_.__mro__[1:-1])
        raise _unsupported(path, value, base=next(((b, c) for b, c in bases if c is not None), None))

    def key(self, key: Any, path: _Path, depth: int) -> Any:
        type_ = type(key)
        if type_ is str or type_ is float or type_ is bool or key is None or type_ is bytes or type_ is int:
            return self.node(key, path, depth)
        if type_ is tuple and depth < MAX_DEPTH:
            return [TAG_TUPLE, *(self.key(part, path, depth + 1) for part in key)]
        raise UnsupportedValueError(
            f"cannot store the dict key {short_repr(key)} under {_render_path(path)}: keys must be str, int, float, "
            "bool, None, bytes, or tuples of these"
        )

    def tensor(self, value: torch.Tensor, path: _Path) -> list[Any]:
        name = TORCH_DTYPE_NAMES.get(value.dtype)
        if name is None:
            raise _unsupported(path, value, f"{value.dtype} tensors are not plain bytes (quantized?)")
        if value.layout is not torch.strided or value.is_nested:
            why = f"only dense tensors are stored, this one is {value.layout}; call .to_dense() first"
            raise _unsupported(path, value, why)
        if value.device.type == "meta":
            raise _unsupported(path, value, "meta tensors have no data to store")
        nbytes = value.numel() * value.element_size()
        return [TAG_TENSOR, name, list(value.shape), self.reserve(nbytes, value), nbytes]

    def object_array(self, value: np.ndarray, path: _Path, depth: int) -> list[Any]:
        self.enter(value, path, depth)
        shape = value.shape
        out: list[Any] = [TAG_OBJARRAY, list(shape)]
        for i, item in enumerate(value.flat):
            out.append(self.node(item, (path, (i, shape), "flat"), depth + 1))
        self.active.discard(id(value))
        return out


def _write_tensor(out: bytearray | np.ndarray, offset: int, nbytes: int, value: torch.Tensor) -> None:
    """Copy a tensor's bytes into `out` (a payload buffer: a bytearray or a uint8 array) once, straight from its
    device, as C-contiguous bytes."""
    src = value.detach().resolve_conj().resolve_neg()
    width = SAME_WIDTH_INT.get(src.element_size())
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
        CodecPluginError: the codec plugin installed for a value's type failed to load (an
            `UnsupportedValueError` too); the message names the entry point.
    """
    return _encode(value, registry, bytearray)


def encode_payload_array(value: Any, *, registry: CodecRegistry | None = None) -> np.ndarray:
    """`encode_payload`, into a 1-D uint8 numpy array instead of a bytearray (same bytes).

    For the journal's record path: a bytearray is zero-filled in 4 KiB pages on allocation, which for a
    payload of tens of MB costs several times the copy that follows; numpy's allocation is left
    uninitialised and asks for transparent huge pages, and only the padding is zeroed here.
    """
    return _encode(value, registry, lambda size: np.empty(size, dtype=np.uint8))


def encode_payload_parts(value: Any, *, registry: CodecRegistry | None = None) -> List[Any]:
    """`encode_payload` as its pieces in order, not joined (for a ``writev`` of them).

    The first piece is the prefix and header with the padding up to the first buffer; then each
    tensor's or array's bytes and the padding after it. A contiguous CPU tensor or C-contiguous array
    is its own memory, not copied (a view, valid while the value is unchanged); anything else (another
    device, strides, a conjugate) is copied once. Joined, the pieces are `encode_payload`'s bytes.
    """
    encoder, header, data_start, total = _lay_out(value, registry)
    prefix = PREFIX.pack(PAYLOAD_MAGIC, FORMAT_VERSION, b"\0\0\0", len(header))
    parts: List[Any] = [b"".join((prefix, header, bytes(data_start - len(prefix) - len(header))))]
    written = data_start
    for offset, nbytes, source in encoder.buffers:
        start = data_start + offset
        if start > written:
            parts.append(bytes(start - written))
        parts.append(_own_bytes(source, nbytes))
        written = start + nbytes
    if total > written:
        parts.append(bytes(total - written))
    return parts


def _own_bytes(source: Any, nbytes: int) -> Any:
    """A value's bytes in C order: a view of its own memory when it is laid out so, else a copy."""
    if isinstance(source, torch.Tensor):
        src = source.detach()
        width = SAME_WIDTH_INT.get(src.element_size())
        if (width is not None and src.device.type == "cpu" and src.is_contiguous() and not src.is_conj()
                and not src.is_neg()):
            return src.view(width).reshape(-1).numpy().view(np.uint8)
        out = np.empty(nbytes, dtype=np.uint8)
        _write_tensor(out, 0, nbytes, source)
        return out
    if source.flags.c_contiguous:
        return source.reshape(-1).view(np.uint8)
    out = np.empty(nbytes, dtype=np.uint8)
    out.view(source.dtype).reshape(source.shape)[...] = source
    return out


def _lay_out(value: Any, registry: CodecRegistry | None) -> Tuple[_Encoder, bytes, int, int]:
    """(the walked value, its header, where its buffers start, the payload's size)."""
    encoder = _Encoder(default_registry if registry is None else registry)
    try:
        tree = encoder.node(value, None, 0)
    except RecursionError:
        # Only reachable when the caller is already deep in the stack; MAX_DEPTH covers the rest.
        raise UnsupportedValueError(
            f"the value nests too deeply to store (limit {MAX_DEPTH} levels)"
        ) from None
    header = msgpack.packb(tree, use_bin_type=True, unicode_errors="surrogatepass")
    data_start = align(PREFIX.size + len(header))
    return encoder, header, data_start, data_start + encoder.size


def _encode(value: Any, registry: CodecRegistry | None, allocate: Callable[[int], Any]) -> Any:
    encoder, header, data_start, total = _lay_out(value, registry)
    out = allocate(total)
    view = memoryview(out).cast("B")
    PREFIX.pack_into(view, 0, PAYLOAD_MAGIC, FORMAT_VERSION, b"\0\0\0", len(header))
    view[PREFIX.size : PREFIX.size + len(header)] = header
    # `out` may be uninitialised: every byte between the buffers (alignment padding) is written as zero.
    written = PREFIX.size + len(header)
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


