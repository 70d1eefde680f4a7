"""Pickle-free payload codec: Python values, torch tensors and numpy arrays to bytes and back.

The codec's face; its rooms are `_codec_format` (the byte layout, node tags, dtype allow-lists and
limits: read its docstring for the format), `_codec_registry` (custom types by name),
`_codec_plugins` (the codecs installed distributions declare, loaded on a registry's miss),
`_codec_encode` and `_codec_decode` (also `describe_payload`).
"""

from __future__ import annotations

from ._codec_decode import decode_payload, decode_payload_releasing, describe_payload
from ._codec_encode import encode_payload, encode_payload_array, encode_payload_parts
from ._codec_format import FORMAT_VERSION, MAX_DEPTH, PAYLOAD_MAGIC
from ._codec_registry import CodecRegistry, default_registry, register_codec

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
    "encode_payload_parts",
    "register_codec",
]
