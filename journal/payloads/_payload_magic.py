"""The first bytes of an encoded payload, apart from the codec (which imports torch): a reader that
only checks a payload's form and digest (`verify`) needs them and nothing else of the codec."""

from __future__ import annotations

__all__ = ["PAYLOAD_MAGIC"]

PAYLOAD_MAGIC = b"SJP\x01"
