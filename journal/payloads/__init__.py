"""Payloads: the codec, the pipeline (encode, digest, compress) and the stores (LMDB, files, object storage).

Public here: the codec registry and its functions (docs/journal.md, "Codecs"), the stores and their protocol
(docs/sharing.md), and a payload prepared ahead of its record.
"""

from typing import TYPE_CHECKING

from ..base._face import lazy_face

if TYPE_CHECKING:
    from ._codec import (CodecRegistry, decode_payload, default_registry, describe_payload, encode_payload,
                         register_codec)
    from ._object_store import ObjectPayloadStore, open_payload_store
    from ._payload_store import LmdbPayloadStore, PayloadStore
    from ._store_protocol import PayloadStoreBase
    from ._payloads import PreparedPayload

__all__ = [
    "CodecRegistry",
    "decode_payload",
    "default_registry",
    "describe_payload",
    "encode_payload",
    "register_codec",
    "LmdbPayloadStore",
    "ObjectPayloadStore",
    "PayloadStore",
    "PayloadStoreBase",
    "open_payload_store",
    "PreparedPayload",
]

__getattr__, __dir__ = lazy_face(globals())
