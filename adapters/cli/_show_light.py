"""``show`` without torch: a payload's structure and values read from its bytes with msgpack and numpy.

Importing torch costs a second, and ``show`` only displays. A payload whose every node is a plain value, a
list, tuple or dict (keys text or ints), or a tensor or array of a dtype numpy holds as it is (below) is read
here: its digest checked, its tree described as `stepjournal.payloads.describe_payload` describes it, its tensors
as numpy views. Any other node (a custom codec's value, a bfloat16 tensor, an object array, a numpy scalar, a
big int) returns None, and ``show`` takes the codec's path (torch). Bytes that are not a well-formed payload
return None too: the codec's path says what is wrong, in its words. `tests/integration/test_journal_tokenizer.py`
checks that both paths print the same tree.
"""

from __future__ import annotations

import math
import struct
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:  # the CLI's light path imports neither at run time
    from stepjournal import Journal
    from stepjournal.events import PayloadRef

__all__ = ["light_payload", "light_load"]

# The payload format (stepjournal.payloads._codec_format, which imports torch): prefix, alignment, tags.
_PREFIX = struct.Struct("<4sB3sQ")
_MAGIC, _VERSION, _ALIGN = b"SJP\x01", 1, 64
_LIST, _TUPLE, _DICT, _TENSOR, _NDARRAY = 0, 1, 2, 4, 5
_STR_PREVIEW = 80
_MAX_DEPTH = 64
_MAX_NDIM = 64
# torch dtypes whose bytes numpy reads as they are (little-endian, as the format stores them).
_TORCH_AS_NUMPY = {"torch.float64": "<f8", "torch.float32": "<f4", "torch.float16": "<f2", "torch.int64": "<i8",
                   "torch.int32": "<i4", "torch.int16": "<i2", "torch.int8": "|i1", "torch.uint8": "|u1",
                   "torch.bool": "|b1"}
_NUMPY_KINDS = frozenset("biuf")


class _Unsupported(Exception):
    """A node this reader leaves to the codec."""


def _shorten(text: str) -> str:
    return text if len(text) <= _STR_PREVIEW else text[: _STR_PREVIEW - 1] + "…"


class _Walk:
    def __init__(self, view: memoryview, data_start: int, max_items: Optional[int]) -> None:
        import numpy as np

        self.np = np
        self.view = view
        self.data_start = data_start
        self.data_size = len(view) - data_start
        self.cursor = 0
        self.max_items = max_items

    def head(self, items: List[Any]) -> List[Any]:
        return items if self.max_items is None else items[: self.max_items]

    def node(self, node: Any, depth: int) -> Tuple[Dict[str, Any], Any]:
        if depth > _MAX_DEPTH:
            raise _Unsupported
        kind = type(node)
        if node is None:
            return {"kind": "none"}, None
        if kind is bool:
            return {"kind": "bool", "value": node}, node
        if kind is int:
            if node.bit_length() > 256:
                raise _Unsupported
            return {"kind": "int", "value": node}, node
        if kind is float:
            return {"kind": "float", "value": node if math.isfinite(node) else repr(node)}, node
        if kind is str:
            return {"kind": "str", "length": len(node), "value": _shorten(node)}, node
        if kind is bytes:
            return {"kind": "bytes", "nbytes": len(node)}, node
        if kind is not list or not node or type(node[0]) is not int:
            raise _Unsupported
        tag = node[0]
        if tag in (_LIST, _TUPLE):
            pairs = [self.node(item, depth + 1) for item in node[1:]]
            value = [v for _, v in pairs]
            return ({"kind": "list" if tag == _LIST else "tuple", "length": len(pairs),
                     "items": self.head([d for d, _ in pairs])}, value if tag == _LIST else tuple(value))
        if tag == _DICT:
            if len(node) % 2 != 1:
                raise _Unsupported
            items: List[Dict[str, Any]] = []
            mapping: Dict[Any, Any] = {}
            for key, item in zip(node[1::2], node[2::2]):
                if type(key) not in (str, int) or key in mapping:
                    raise _Unsupported
                described, mapping[key] = self.node(item, depth + 1)
                items.append({"key": _shorten(key) if type(key) is str else repr(key), "value": described})
            return {"kind": "dict", "length": len(items), "items": self.head(items)}, mapping
        if tag in (_TENSOR, _NDARRAY) and len(node) == 5:
            return self.buffer(node, tag)
        raise _Unsupported

    def buffer(self, node: List[Any], tag: int) -> Tuple[Dict[str, Any], Any]:
        np = self.np
        _, name, shape, offset, nbytes = node
        if type(name) is not str:
            raise _Unsupported
        if tag == _TENSOR:
            if name not in _TORCH_AS_NUMPY:
                raise _Unsupported
            dtype = np.dtype(_TORCH_AS_NUMPY[name])
        else:
            try:
                dtype = np.dtype(name)
            except TypeError:
                raise _Unsupported from None
            if dtype.kind not in _NUMPY_KINDS or dtype.str != name:
                raise _Unsupported
        if (type(shape) is not list or len(shape) > _MAX_NDIM
                or not all(type(s) is int and 0 <= s < 1 << 62 for s in shape)):
            raise _Unsupported
        count = math.prod(shape)
        if (type(nbytes) is not int or type(offset) is not int or count * dtype.itemsize != nbytes
                or offset < self.cursor or offset + nbytes > self.data_size):
            raise _Unsupported
        self.cursor = offset + nbytes
        start = self.data_start + offset
        array = np.frombuffer(self.view[start:start + nbytes], dtype=dtype).reshape(shape)
        return ({"kind": "tensor" if tag == _TENSOR else "ndarray", "dtype": name, "shape": list(shape),
                 "nbytes": nbytes}, array)


def light_payload(raw: bytes, digest: str, max_items: Optional[int]) -> Optional[Tuple[Dict[str, Any], Any]]:
    """(the `describe_payload` tree, the value with numpy arrays for tensors) of payload bytes `raw` whose
    BLAKE3 digest is `digest`; None when the payload holds a node left to the codec, or is not well formed."""
    import blake3
    import msgpack

    if blake3.blake3(raw).hexdigest() != digest:
        return None
    view = memoryview(raw)
    if len(view) < _PREFIX.size:
        return None
    magic, version, reserved, header_len = _PREFIX.unpack_from(view, 0)
    data_start = -(-(_PREFIX.size + header_len) // _ALIGN) * _ALIGN
    if (magic, version, reserved) != (_MAGIC, _VERSION, b"\0\0\0") or data_start > len(view):
        return None
    try:
        root = msgpack.unpackb(view[_PREFIX.size:_PREFIX.size + header_len], raw=False, use_list=True,
                               strict_map_key=True, max_str_len=header_len, max_bin_len=header_len,
                               max_array_len=header_len, max_map_len=0, max_ext_len=0)
        return _Walk(view, data_start, max_items).node(root, 0)
    except (_Unsupported, ValueError, TypeError, RecursionError, msgpack.ExtraData, msgpack.FormatError,
            msgpack.StackError):
        return None


def light_load(journal: "Journal") -> Callable[..., Any]:
    """``load(ref, step=None)``: a payload of `journal` read by `light_payload` when it allows, else by
    `Journal.load` (the codec, torch), which also says what is wrong with one that cannot be read."""
    from stepjournal.errors import StepJournalError

    def load(ref: "PayloadRef", step: Optional[int] = None) -> Any:
        try:
            found = light_payload(journal.payload_bytes(ref.digest), ref.digest, 0)
        except StepJournalError:  # missing or released: the codec's path names the step
            found = None
        return found[1] if found is not None else journal.load(ref, step=step)

    return load
