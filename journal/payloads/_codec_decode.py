"""Decoding and describing a payload: every length, offset and dtype checked before anything is allocated."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import torch

from ..base._errors import PayloadDecodeError, UnknownCodecError
from ._codec_format import (DEFAULT_MAX_ITEMS, FORMAT_VERSION, MAX_DEPTH, MAX_DIM, MAX_NDIM, NAT, PAYLOAD_MAGIC, PREFIX,
                            TAG_BIGINT, TAG_DICT, TAG_EXT, TAG_LIST, TAG_NDARRAY, TAG_NPSCALAR, TAG_OBJARRAY,
                            TAG_TENSOR, TAG_TUPLE, TORCH_DTYPES, align, numpy_dtype, short_repr, shorten)
from ._codec_registry import CodecRegistry, default_registry

__all__ = ["decode_payload", "decode_payload_releasing", "describe_payload"]


def _bad(detail: str) -> PayloadDecodeError:
    return PayloadDecodeError(f"payload bytes are malformed: {detail}", detail=detail)


def _reject_ext(code: int, data: bytes) -> Any:
    raise _bad(f"msgpack ext type {code} in the header")


class _FrameReader:
    """Validates a payload's framing and walks its header, to decode or to describe it."""

    def __init__(
        self,
        data: bytes | bytearray | memoryview,
        registry: CodecRegistry,
        release: Callable[[int, int], None] | None = None,
        adopt: bool = False,
    ) -> None:
        self.release = release
        try:
            view = memoryview(data).cast("B")
        except TypeError as exc:
            raise TypeError(
                f"payload must be bytes, bytearray or a contiguous memoryview, got {type(data).__name__}"
            ) from exc
        if adopt and view.readonly:
            raise TypeError("only a writable payload buffer can be adopted (tensors would alias read-only memory)")
        self.adopt = adopt
        total = len(view)
        if total < PREFIX.size:
            raise _bad(f"{total} bytes is shorter than the {PREFIX.size}-byte prefix")
        magic, version, reserved, header_len = PREFIX.unpack_from(view, 0)
        if magic != PAYLOAD_MAGIC:
            raise _bad(f"starts with {bytes(magic)!r}, not {PAYLOAD_MAGIC!r}; not a stepjournal payload")
        if version != FORMAT_VERSION:
            raise _bad(f"format version {version}; this stepjournal reads version {FORMAT_VERSION} (upgrade?)")
        if reserved != b"\0\0\0":
            raise _bad("reserved prefix bytes are not zero")
        if header_len > total - PREFIX.size:
            raise _bad(f"header claims {header_len} bytes but only {total - PREFIX.size} follow the prefix")
        self.data_start = align(PREFIX.size + header_len)
        if self.data_start > total:
            raise _bad("payload ends inside the header padding")
        self.data_size = total - self.data_start
        self.cursor = 0
        self.view = view
        self.registry = registry
        try:
            self.root = msgpack.unpackb(
                view[PREFIX.size : PREFIX.size + header_len],
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
                f"buffer at offset {short_repr(offset)} of {nbytes} bytes is outside the data section "
                "or overlaps another"
            )
        # Buffers may not overlap, so all allocations together stay within the input's size.
        self.cursor = offset + nbytes
        return self.data_start + offset

    @staticmethod
    def shape(raw: object, itemsize: int) -> tuple[tuple[int, ...], int]:
        """Validate a shape; return it and its element count."""
        if type(raw) is not list or len(raw) > MAX_NDIM:
            raise _bad(f"shape {short_repr(raw)} is not a list of at most {MAX_NDIM} sizes")
        for size in raw:
            if type(size) is not int or not 0 <= size <= MAX_DIM:
                raise _bad(f"shape {short_repr(raw)} holds an invalid size")
        # numpy and torch refuse shapes whose sizes multiply past 2**63 even when one of them is 0.
        if math.prod(max(size, 1) for size in raw) * itemsize > MAX_DIM:
            raise _bad(f"shape {short_repr(raw)} is too large")
        return tuple(raw), math.prod(raw)

    def buffer_spec(self, node: list[Any]) -> tuple[Any, tuple[int, ...], int, int]:
        """Validate a tensor or array node; return (dtype, shape, start in data, nbytes)."""
        if len(node) != 5:
            raise _bad("tensor or array node does not have 5 fields")
        _, name, raw_shape, offset, nbytes = node
        if node[0] == TAG_TENSOR:
            dtype: Any = TORCH_DTYPES.get(name) if type(name) is str else None
            itemsize = dtype.itemsize if dtype is not None else 0
        else:
            dtype = numpy_dtype(name)
            itemsize = dtype.itemsize if dtype is not None else 0
        if dtype is None:
            raise _bad(f"unknown dtype {short_repr(name)}")
        shape, count = self.shape(raw_shape, itemsize)
        if type(nbytes) is not int or count * itemsize != nbytes:
            raise _bad(f"{short_repr(nbytes)} bytes do not hold shape {short_repr(list(shape))} of {name}")
        return dtype, shape, self.claim(offset, nbytes), nbytes

    def codec_name(self, node: list[Any]) -> str:
        if len(node) != 3 or type(node[1]) is not str:
            raise _bad("custom codec node does not have a name and a value")
        return node[1]

    def scalar_spec(self, node: list[Any]) -> tuple[np.dtype, bytes]:
        if len(node) != 3:
            raise _bad("numpy scalar node does not have 3 fields")
        dtype = numpy_dtype(node[1])
        if dtype is None or type(node[2]) is not bytes or len(node[2]) != dtype.itemsize:
            raise _bad(f"numpy scalar of dtype {short_repr(node[1])} is malformed")
        # numpy only makes a scalar of a unitless datetime when it is NaT.
        if dtype.kind in "mM" and np.datetime_data(dtype)[0] == "generic" and node[2] != NAT:
            raise _bad(f"numpy scalar of dtype {short_repr(node[1])} is not NaT")
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
        if tag == TAG_TUPLE:
            return tuple(self.key(part, depth + 1) for part in node[1:])
        if tag == TAG_BIGINT:
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
        if tag == TAG_LIST:
            return [self.decode(item, depth + 1) for item in node[1:]]
        if tag == TAG_TUPLE:
            return tuple(self.decode(item, depth + 1) for item in node[1:])
        if tag == TAG_DICT:
            if len(node) % 2 != 1:
                raise _bad("dict node has a key without a value")
            return {
                self.key(node[i], depth + 1): self.decode(node[i + 1], depth + 1)
                for i in range(1, len(node), 2)
            }
        if tag == TAG_BIGINT:
            return self.bigint(node)
        if tag == TAG_TENSOR:
            dtype, shape, start, nbytes = self.buffer_spec(node)
            # numpy, unlike torch's CPU allocator, asks the kernel for transparent huge pages on large
            # buffers: first-touch page faults of 4 KiB pages cost 4-5x the copy itself (86 MB: ~40 ms
            # against ~8 ms). The tensor owns the array; its storage is just not resizable.
            if not nbytes:
                return torch.empty(0, dtype=torch.uint8).view(dtype).reshape(shape)
            if self.adopt:  # a view of the handed-over buffer: no copy, the buffer lives with it
                return torch.from_numpy(np.frombuffer(self.view, dtype=np.uint8, count=nbytes, offset=start)).view(
                    dtype).reshape(shape)
            array = np.empty(nbytes, dtype=np.uint8)
            array[:] = np.frombuffer(self.view, dtype=np.uint8, count=nbytes, offset=start)
            if self.release is not None:
                self.release(start, start + nbytes)
            return torch.from_numpy(array).view(dtype).reshape(shape)
        if tag == TAG_NDARRAY:
            dtype, shape, start, nbytes = self.buffer_spec(node)
            if self.adopt and nbytes:
                return np.frombuffer(self.view, dtype=np.uint8, count=nbytes, offset=start).view(dtype).reshape(shape)
            array = np.empty(shape, dtype=dtype)
            if nbytes:
                source = np.frombuffer(self.view, dtype=np.uint8, count=nbytes, offset=start)
                array.reshape(-1).view(np.uint8)[:] = source
                if self.release is not None:
                    self.release(start, start + nbytes)
            return array
        if tag == TAG_OBJARRAY:
            if len(node) < 2:
                raise _bad("object array node has no shape")
            shape, count = self.shape(node[1], 8)
            if count != len(node) - 2:
                raise _bad(f"object array of shape {short_repr(list(shape))} holds {len(node) - 2} items")
            array = np.empty(count, dtype=object)
            for i in range(count):
                array[i] = self.decode(node[i + 2], depth + 1)
            return array.reshape(shape)
        if tag == TAG_NPSCALAR:
            dtype, raw = self.scalar_spec(node)
            return np.frombuffer(raw, dtype=dtype, count=1)[0]
        if tag == TAG_EXT:
            name = self.codec_name(node)
            codec = self.registry.codec_named(name)
            if codec is None:
                raise UnknownCodecError(
                    f"payload holds a value of custom codec {short_repr(name)}, which is not registered in this "
                    f"process and no installed codec plugin provides it; import the adapter that registers "
                    f"it, or call "
                    f"stepjournal.payloads.register_codec(<type>, {short_repr(name)}, encode=..., decode=...) first",
                    detail=f"unknown codec {short_repr(name)}",
                )
            inner = self.decode(node[2], depth + 1)
            try:
                return codec.decode(inner)
            except PayloadDecodeError:
                raise
            except Exception as exc:
                why = f"codec {short_repr(name)} could not decode its value ({type(exc).__name__}: {exc})"
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
            return {"kind": "str", "length": len(node), "value": shorten(node)}
        if type_ is bytes:
            return {"kind": "bytes", "nbytes": len(node)}
        tag = self.tag(node, depth)
        if tag in (TAG_LIST, TAG_TUPLE):
            items = node[1:]
            return {
                "kind": "list" if tag == TAG_LIST else "tuple",
                "length": len(items),
                "items": [self.describe(item, depth + 1, max_items) for item in _head(items, max_items)],
            }
        if tag == TAG_DICT:
            if len(node) % 2 != 1:
                raise _bad("dict node has a key without a value")
            pairs = list(zip(node[1::2], node[2::2]))
            described = []
            for key, value in _head(pairs, max_items):
                decoded = self.key(key, depth + 1)
                described.append({
                    "key": shorten(decoded) if type(decoded) is str else short_repr(decoded),
                    "value": self.describe(value, depth + 1, max_items),
                })
            return {"kind": "dict", "length": len(pairs), "items": described}
        if tag == TAG_BIGINT:
            return _describe_int(self.bigint(node))
        if tag in (TAG_TENSOR, TAG_NDARRAY):
            dtype, shape, _, nbytes = self.buffer_spec(node)
            return {
                "kind": "tensor" if tag == TAG_TENSOR else "ndarray",
                "dtype": node[1],
                "shape": list(shape),
                "nbytes": nbytes,
            }
        if tag == TAG_OBJARRAY:
            if len(node) < 2:
                raise _bad("object array node has no shape")
            shape, count = self.shape(node[1], 8)
            if count != len(node) - 2:
                raise _bad(f"object array of shape {short_repr(list(shape))} holds {len(node) - 2} items")
            return {
                "kind": "object_array",
                "shape": list(shape),
                "items": [self.describe(item, depth + 1, max_items) for item in _head(node[2:], max_items)],
            }
        if tag == TAG_NPSCALAR:
            dtype, raw = self.scalar_spec(node)
            scalar = np.frombuffer(raw, dtype=dtype, count=1)[0]
            return {"kind": "numpy_scalar", "dtype": node[1], "value": shorten(str(scalar))}
        if tag == TAG_EXT:
            name = self.codec_name(node)
            return {
                "kind": "ext",
                "name": name,
                "registered": name in self.registry,
                "value": self.describe(node[2], depth + 1, max_items),
            }
        raise _bad(f"unknown node kind {tag}")


def _describe_int(value: int) -> dict[str, Any]:
    # Very long ints have no decimal form within Python's default digit limit, and none is useful.
    if value.bit_length() <= 256:
        return {"kind": "int", "value": value}
    return {"kind": "int", "bits": value.bit_length(), "hex": shorten(hex(value))}


def _head(items: list[Any], max_items: int | None) -> list[Any]:
    return items if max_items is None else items[:max_items]


def _read(
    data: bytes | bytearray | memoryview,
    registry: CodecRegistry | None,
    walk: Callable[[_FrameReader], Any],
    release: Callable[[int, int], None] | None = None,
    adopt: bool = False,
) -> Any:
    reader = _FrameReader(data, default_registry if registry is None else registry, release, adopt)
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
        UnknownCodecError: the payload holds a custom type whose codec is not registered (and no
            installed codec plugin provides it).
        CodecPluginError: the codec plugin installed for a codec name failed to load (an
            `UnknownCodecError` too); the message names the entry point.
        PayloadDecodeError: the bytes are not a well-formed payload, or a codec failed on them.
        TypeError: `data` is not bytes-like.
    """
    return _read(data, registry, lambda reader: reader.decode(reader.root, 0))


def decode_payload_releasing(
    data: memoryview, *, registry: CodecRegistry | None = None, release: Callable[[int, int], None] | None,
    adopt: bool = False,
) -> Any:
    """`decode_payload`, calling ``release(start, stop)`` on each tensor's or array's bytes of `data`
    right after they are copied out, so the journal can unmap an LMDB value's pages as it goes.

    With `adopt`, `data` (writable, handed over by its store for keeps) is not copied: tensors and
    arrays are views of it, and keep it alive.
    """
    return _read(data, registry, lambda reader: reader.decode(reader.root, 0), release, adopt)


def describe_payload(
    data: bytes | bytearray | memoryview,
    *,
    registry: CodecRegistry | None = None,
    max_items: int | None = DEFAULT_MAX_ITEMS,
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

