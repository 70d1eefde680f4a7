"""The ``verl.TQBatch`` payload codec: what verl's V1 trainer moves through TransferQueue, without pickle.

V1 samples trajectories as a ``KVBatchMeta`` (keys ``{uid}_{session}_{index}`` and one tag dict per
key) whose fields live in TransferQueue as a TensorDict of jagged nested tensors (``prompts``,
``responses``, ``rm_scores`` ...), plain tensors and per-row Python values (``NonTensorStack``:
``uid``, ``raw_prompt``, ``extra_fields`` ...). `TQBatch` holds the three together and is stored as
a plain tree of the journal's native values:

    {"v": 1, "partition_id": str | None, "keys": [str, ...], "tags": [dict, ...],
     "fields": <tensordict>}

    <tensordict> = {"kind": "tensordict", "batch_size": [...], "fields": {key: <field>, ...}}
    <field>      = tensor
                 | {"kind": "nested", "layout": "jagged" | "strided", "components": [tensor, ...]}
                 | {"kind": "nontensor", "batch_size": [...], "data": value}       # NonTensorData
                 | {"kind": "nontensorstack", "batch_size": [...], "items": [value, ...]}
                 | <tensordict>

Tensors keep dtype, shape and bits; nested tensors keep their components (hence their offsets);
field order is kept; per-row values come back as plain dicts, lists and scalars (tensordict's
``LinkedList`` as ``list``). Everything comes back on the CPU.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Tuple

import attrs
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict, TensorDictBase

from stepjournal.errors import PayloadDecodeError, UnsupportedValueError
from stepjournal.payloads import CodecRegistry, default_registry

from .._codec import value_diff as _codec_value_diff  # one exact comparison for both codecs

__all__ = ["TQBatch", "TQ_CODEC_NAME", "encode_tq_batch", "decode_tq_batch", "tq_batch_diff", "register_tq_codec"]

TQ_CODEC_NAME = "verl.TQBatch"
_SCHEMA = 1


def _key_tuple(keys: Iterable[str]) -> Tuple[str, ...]:
    return tuple(keys)


@attrs.frozen(eq=False)
class TQBatch:
    """One sampled V1 batch: the ``KVBatchMeta`` keys and tags and the TransferQueue fields of those keys.

    Attributes:
        fields: the TensorDict that ``transfer_queue.kv_batch_get(keys, partition_id)`` returned
            (one row per key, in key order).
        keys: the trajectory keys, ``{uid}_{session_id}_{index}``.
        tags: one tag dict per key (status, lengths, ``global_steps``, ``min/max_global_steps`` ...).
        partition_id: the TransferQueue partition (``"train"``).
    """

    fields: TensorDict
    keys: Tuple[str, ...] = attrs.field(converter=_key_tuple)
    tags: Tuple[Dict[str, Any], ...] = attrs.field(converter=lambda tags: tuple(dict(t) for t in tags))
    partition_id: Optional[str] = "train"

    def __len__(self) -> int:
        return len(self.keys)


def _plain(value: Any) -> Any:
    """tensordict's list subclasses (``LinkedList``) and tuples-of-lists as the plain containers they hold."""
    if isinstance(value, NonTensorData):
        return _plain(value.data)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _encode_td(td: TensorDictBase, where: str) -> Dict[str, Any]:
    fields: Dict[str, Any] = {}
    for key in td.keys():
        value = td.get(key)
        path = f"{where}.{key}"
        if isinstance(value, NonTensorData):
            fields[key] = {"kind": "nontensor", "batch_size": list(value.batch_size), "data": _plain(value.data)}
        elif isinstance(value, NonTensorStack):
            fields[key] = {"kind": "nontensorstack", "batch_size": list(value.batch_size),
                           "items": _plain(value.tolist())}
        elif isinstance(value, TensorDictBase):
            fields[key] = _encode_td(value if type(value) is TensorDict else value.to_tensordict(), path)
        elif isinstance(value, torch.Tensor):
            if value.is_nested:
                layout = "jagged" if value.layout == torch.jagged else "strided"
                fields[key] = {"kind": "nested", "layout": layout,
                               "components": [t.contiguous() for t in value.unbind()]}
            else:
                fields[key] = value.as_subclass(torch.Tensor) if type(value) is not torch.Tensor else value
        else:
            raise UnsupportedValueError(f"cannot store {type(value).__name__} at {path}: "
                                        "a V1 batch holds tensors and non-tensor data")
    return {"kind": "tensordict", "batch_size": list(td.batch_size), "fields": fields}


def _decode_td(node: Any, where: str) -> TensorDict:
    if not isinstance(node, dict) or node.get("kind") != "tensordict" or not isinstance(node.get("fields"), dict):
        raise PayloadDecodeError(f"{where} is not an encoded TensorDict")
    td = TensorDict({}, batch_size=node["batch_size"])
    for key, value in node["fields"].items():
        kind = value.get("kind") if isinstance(value, dict) else None
        if isinstance(value, torch.Tensor):
            td.set(key, value)
        elif kind == "tensordict":
            td.set(key, _decode_td(value, f"{where}.{key}"))
        elif kind == "nested":
            layout = torch.jagged if value["layout"] == "jagged" else torch.strided
            td.set(key, torch.nested.nested_tensor(list(value["components"]), layout=layout))
        elif kind == "nontensor":
            td.set(key, NonTensorData(value["data"], batch_size=value["batch_size"]))
        elif kind == "nontensorstack":
            stack = NonTensorStack.from_list(list(value["items"]))
            td.set(key, stack)
        else:
            raise PayloadDecodeError(f"{where}.{key} holds an unknown field kind {kind!r}")
    return td


def encode_tq_batch(batch: TQBatch) -> Dict[str, Any]:
    """Turn a `TQBatch` into a tree of tensors and plain values (the codec's encode)."""
    return {
        "v": _SCHEMA,
        "partition_id": batch.partition_id,
        "keys": list(batch.keys),
        "tags": [_plain(dict(t)) for t in batch.tags],
        "fields": _encode_td(batch.fields, "fields"),
    }


def decode_tq_batch(node: Any) -> TQBatch:
    """Rebuild a `TQBatch` from `encode_tq_batch`'s tree (the codec's decode)."""
    if not isinstance(node, dict) or node.get("v") != _SCHEMA:
        version = node.get("v") if isinstance(node, dict) else None
        raise PayloadDecodeError(
            f"verl.TQBatch payload has schema {version!r}; this stepjournal reads schema {_SCHEMA}: upgrade stepjournal"
        )
    keys, tags = node.get("keys"), node.get("tags")
    if not isinstance(keys, list) or not isinstance(tags, list) or len(keys) != len(tags):
        raise PayloadDecodeError("verl.TQBatch payload needs lists of keys and tags of the same length")
    return TQBatch(fields=_decode_td(node["fields"], "fields"), keys=keys, tags=tags,
                   partition_id=node.get("partition_id"))


def register_tq_codec(registry: Optional[CodecRegistry] = None) -> None:
    """Register the `TQBatch` codec in `registry` (`default_registry` when None).

    Importing `stepjournal.adapters.verl` does it for the default registry; it is also the codec plugin
    that pyproject's ``stepjournal.codecs`` / ``stepjournal.codec_names`` entry points name.
    """
    target = default_registry if registry is None else registry
    target.register(TQBatch, TQ_CODEC_NAME, encode=encode_tq_batch, decode=decode_tq_batch)


# -- exact comparison -----------------------------------------------------------------------------------


def _value_diff(a: Any, b: Any, where: str, out: List[str]) -> None:
    # tensordict hands per-row values back as LinkedLists: compare the plain values they hold.
    _codec_value_diff(_plain(a), _plain(b), where, out)


def _td_diff(a: TensorDictBase, b: TensorDictBase, where: str, out: List[str]) -> None:
    if a.batch_size != b.batch_size:
        out.append(f"{where}: batch_size {list(a.batch_size)} vs {list(b.batch_size)}")
    if list(a.keys()) != list(b.keys()):
        out.append(f"{where}: keys {list(a.keys())} vs {list(b.keys())}")
        return
    for key in a.keys():
        x, y = a.get(key), b.get(key)
        if isinstance(x, NonTensorStack) or isinstance(y, NonTensorStack):
            if type(x) is not type(y):
                out.append(f"{where}.{key}: {type(x).__name__} vs {type(y).__name__}")
            else:
                _value_diff(x.tolist(), y.tolist(), f"{where}.{key}", out)
        elif isinstance(x, NonTensorData) or isinstance(y, NonTensorData):
            if type(x) is not type(y):
                out.append(f"{where}.{key}: {type(x).__name__} vs {type(y).__name__}")
            else:
                _value_diff(x.data, y.data, f"{where}.{key}", out)
        else:
            _value_diff(x, y, f"{where}.{key}", out)


def tq_batch_diff(a: Any, b: Any, *, where: str = "") -> List[str]:
    """Every difference between two `TQBatch`es (or two TensorDicts); empty when they are identical."""
    out: List[str] = []
    prefix = f"{where}." if where else ""
    if isinstance(a, TQBatch) and isinstance(b, TQBatch):
        if a.partition_id != b.partition_id:
            out.append(f"{prefix}partition_id: {a.partition_id!r} vs {b.partition_id!r}")
        if a.keys != b.keys:
            out.append(f"{prefix}keys differ")
        _value_diff(list(a.tags), list(b.tags), f"{prefix}tags", out)
        _td_diff(a.fields, b.fields, f"{prefix}fields", out)
    elif isinstance(a, TensorDictBase) and isinstance(b, TensorDictBase):
        _td_diff(a, b, f"{prefix}fields", out)
    else:
        out.append(f"{prefix}: {type(a).__name__} vs {type(b).__name__}")
    return out
