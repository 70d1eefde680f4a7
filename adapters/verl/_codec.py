"""The `verl.DataProto` payload codec, and an exact comparison of two DataProtos.

A DataProto is stored as a plain tree the journal stores natively (no pickle):

    {"v": 1,
     "batch": None | <tensordict>,
     "non_tensor_batch": {key: numpy array, ...},      # object arrays item by item
     "meta_info": {...}}                               # any nested value the journal stores

    <tensordict> = {"kind": "tensordict", "batch_size": [...], "device": "cpu" | None,
                    "fields": {key: tensor | <tensordict> | <nested> | <nontensor>, ...}}
    <nested>     = {"kind": "nested", "layout": "strided" | "jagged", "components": [tensor, ...]}
    <nontensor>  = {"kind": "nontensor", "batch_size": [...], "data": value}

Tensors keep their dtype and bits (bf16, fp8 ...); field and key order is kept. Tensors come back on
the CPU; a TensorDict recorded on another device comes back without a device.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from tensordict import NonTensorData, TensorDict, TensorDictBase
from verl.protocol import DataProto

from stepjournal.errors import PayloadDecodeError, UnsupportedValueError
from stepjournal.payloads import CodecRegistry, default_registry

__all__ = ["CODEC_NAME", "encode_dataproto", "decode_dataproto", "dataproto_diff", "register_dataproto_codec",
           "value_diff"]

CODEC_NAME = "verl.DataProto"
_SCHEMA = 1


def _encode_td(td: TensorDictBase, where: str) -> Dict[str, Any]:
    if type(td) is not TensorDict:
        # Lazy stacks and other views: store what they hold, as a plain TensorDict.
        td = td.to_tensordict()
    fields: Dict[str, Any] = {}
    for key in td.keys():
        value = td.get(key)
        path = f"{where}.{key}"
        if isinstance(value, NonTensorData):
            fields[key] = {"kind": "nontensor", "batch_size": list(value.batch_size), "data": value.data}
        elif isinstance(value, TensorDictBase):
            if "NonTensorStack" in type(value).__name__:
                raise UnsupportedValueError(
                    f"cannot store the NonTensorStack at {path}: keep per-row Python values in "
                    "DataProto.non_tensor_batch (numpy object arrays) instead"
                )
            fields[key] = _encode_td(value, path)
        elif isinstance(value, torch.Tensor):
            if value.is_nested:
                layout = "jagged" if value.layout == torch.jagged else "strided"
                fields[key] = {"kind": "nested", "layout": layout,
                               "components": [t.contiguous() for t in value.unbind()]}
            elif type(value) is not torch.Tensor:
                fields[key] = value.as_subclass(torch.Tensor)
            else:
                fields[key] = value
        else:
            raise UnsupportedValueError(
                f"cannot store {type(value).__name__} at {path}: a DataProto batch holds tensors and TensorDicts"
            )
    device = str(td.device) if td.device is not None else None
    return {"kind": "tensordict", "batch_size": list(td.batch_size), "device": device, "fields": fields}


def _decode_td(node: Any, where: str) -> TensorDict:
    if not isinstance(node, dict) or node.get("kind") != "tensordict":
        raise PayloadDecodeError(f"{where} is not an encoded TensorDict")
    fields = {}
    for key, value in node["fields"].items():
        if isinstance(value, torch.Tensor):
            fields[key] = value
        elif isinstance(value, dict) and value.get("kind") == "tensordict":
            fields[key] = _decode_td(value, f"{where}.{key}")
        elif isinstance(value, dict) and value.get("kind") == "nested":
            layout = torch.jagged if value["layout"] == "jagged" else torch.strided
            fields[key] = torch.nested.nested_tensor(list(value["components"]), layout=layout)
        elif isinstance(value, dict) and value.get("kind") == "nontensor":
            fields[key] = NonTensorData(value["data"], batch_size=value["batch_size"])
        else:
            raise PayloadDecodeError(f"{where}.{key} holds an unknown field kind")
    device = node.get("device")
    # Tensors decode on the CPU; claim a device only when that is where they are.
    td = TensorDict({}, batch_size=node["batch_size"], device="cpu" if device == "cpu" else None)
    for key, value in fields.items():
        td.set(key, value)
    return td


def encode_dataproto(data: DataProto) -> Dict[str, Any]:
    """Turn a DataProto into a tree of tensors, numpy arrays and plain values (the codec's encode)."""
    non_tensor = data.non_tensor_batch
    if non_tensor is not None and type(non_tensor) is not dict:
        non_tensor = dict(non_tensor)
    meta = data.meta_info
    if meta is not None and type(meta) is not dict:
        meta = dict(meta)
    return {
        "v": _SCHEMA,
        "batch": _encode_td(data.batch, "batch") if data.batch is not None else None,
        "non_tensor_batch": non_tensor,
        "meta_info": meta,
    }


def decode_dataproto(node: Any) -> DataProto:
    """Rebuild a DataProto from `encode_dataproto`'s tree (the codec's decode)."""
    if not isinstance(node, dict) or node.get("v") != _SCHEMA:
        version = node.get("v") if isinstance(node, dict) else None
        raise PayloadDecodeError(
            f"verl.DataProto payload has schema {version!r}; this stepjournal reads schema {_SCHEMA}: "
            "upgrade stepjournal"
        )
    batch = _decode_td(node["batch"], "batch") if node["batch"] is not None else None
    return DataProto(batch=batch, non_tensor_batch=node["non_tensor_batch"], meta_info=node["meta_info"])


def register_dataproto_codec(registry: Optional[CodecRegistry] = None) -> None:
    """Register the DataProto codec in `registry` (`default_registry` when None).

    Importing `stepjournal.adapters.verl` does it for the default registry; it is also the codec plugin
    that pyproject's ``stepjournal.codecs`` / ``stepjournal.codec_names`` entry points name, so a
    process that never imported the adapter finds the codec on its first DataProto.
    """
    target = default_registry if registry is None else registry
    target.register(DataProto, CODEC_NAME, encode=encode_dataproto, decode=decode_dataproto)


# -- exact comparison ---------------------------------------------------------------------------------


def _tensor_diff(a: torch.Tensor, b: torch.Tensor, where: str, out: List[str]) -> None:
    if a.is_nested or b.is_nested:
        if a.is_nested != b.is_nested or a.layout != b.layout:
            out.append(f"{where}: nested layout differs")
            return
        ua, ub = a.unbind(), b.unbind()
        if len(ua) != len(ub):
            out.append(f"{where}: {len(ua)} vs {len(ub)} components")
            return
        for i, (x, y) in enumerate(zip(ua, ub)):
            _tensor_diff(x, y, f"{where}[{i}]", out)
        return
    if a.dtype != b.dtype or a.shape != b.shape:
        out.append(f"{where}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
        return
    if a.numel() == 0:
        return
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}.get(a.element_size())
    x, y = a.detach().cpu().contiguous(), b.detach().cpu().contiguous()
    if width is not None:
        same = torch.equal(x.view(width), y.view(width))
    else:  # complex128 and other wide types: compare their bytes
        same = bytes(x.view(torch.uint8).numpy()) == bytes(y.view(torch.uint8).numpy())
    if not same:
        out.append(f"{where}: tensor bits differ")


def value_diff(a: Any, b: Any, where: str, out: List[str]) -> None:
    """Append to `out` every difference between two decoded values under `where`: their types, tensors exactly,
    containers item by item."""
    if type(a) is not type(b):
        out.append(f"{where}: {type(a).__name__} vs {type(b).__name__}")
    elif isinstance(a, torch.Tensor):
        _tensor_diff(a, b, where, out)
    elif isinstance(a, np.ndarray):
        if a.dtype != b.dtype or a.shape != b.shape:
            out.append(f"{where}: array {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
        elif a.dtype.kind == "O":
            for i, (x, y) in enumerate(zip(a.reshape(-1), b.reshape(-1))):
                value_diff(x, y, f"{where}[{i}]", out)
        elif a.tobytes() != b.tobytes():
            out.append(f"{where}: array contents differ")
    elif isinstance(a, dict):
        if list(a.keys()) != list(b.keys()):
            out.append(f"{where}: keys {list(a.keys())} vs {list(b.keys())}")
        else:
            for key in a:
                value_diff(a[key], b[key], f"{where}[{key!r}]", out)
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            out.append(f"{where}: length {len(a)} vs {len(b)}")
        else:
            for i, (x, y) in enumerate(zip(a, b)):
                value_diff(x, y, f"{where}[{i}]", out)
    elif isinstance(a, float):
        if not (a == b or (math.isnan(a) and math.isnan(b))):
            out.append(f"{where}: {a!r} vs {b!r}")
    elif isinstance(a, np.generic):
        if a.tobytes() != b.tobytes():
            out.append(f"{where}: {a!r} vs {b!r}")
    elif isinstance(a, TensorDictBase):
        _td_diff(a, b, where, out)
    elif isinstance(a, DataProto):
        out.extend(dataproto_diff(a, b, where=where))
    elif a != b:
        out.append(f"{where}: {a!r} vs {b!r}")


def _td_diff(a: TensorDictBase, b: TensorDictBase, where: str, out: List[str]) -> None:
    if a.batch_size != b.batch_size:
        out.append(f"{where}: batch_size {list(a.batch_size)} vs {list(b.batch_size)}")
    keys_a, keys_b = list(a.keys()), list(b.keys())
    if keys_a != keys_b:
        out.append(f"{where}: keys {keys_a} vs {keys_b}")
        return
    for key in keys_a:
        x, y = a.get(key), b.get(key)
        if isinstance(x, NonTensorData) or isinstance(y, NonTensorData):
            value_diff(getattr(x, "data", x), getattr(y, "data", y), f"{where}.{key}", out)
        elif isinstance(x, TensorDictBase) and isinstance(y, TensorDictBase):
            _td_diff(x, y, f"{where}.{key}", out)
        else:
            value_diff(x, y, f"{where}.{key}", out)


def dataproto_diff(a: DataProto, b: DataProto, *, where: str = "") -> List[str]:
    """Every difference between two DataProtos; empty when they are identical.

    Identical means: same batch keys in the same order with bit-equal tensors of the same dtype and
    shape (NaN payloads included), same batch size, same non-tensor keys with equal arrays (object
    arrays compared item by item, types included), and equal meta_info.
    """
    out: List[str] = []
    prefix = f"{where}." if where else ""
    if (a.batch is None) != (b.batch is None):
        kinds = ["None" if side.batch is None else "TensorDict" for side in (a, b)]
        out.append(f"{prefix}batch: {kinds[0]} vs {kinds[1]}")
    elif a.batch is not None:
        _td_diff(a.batch, b.batch, f"{prefix}batch", out)
    value_diff(dict(a.non_tensor_batch or {}), dict(b.non_tensor_batch or {}), f"{prefix}non_tensor_batch", out)
    value_diff(dict(a.meta_info or {}), dict(b.meta_info or {}), f"{prefix}meta_info", out)
    return out
