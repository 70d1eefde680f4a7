"""`CodecRegistry`: codecs for custom payload types, registered by a stable name that payloads store."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import attrs

from ._codec_format import _is_native_type, _type_name

__all__ = ["CodecRegistry", "default_registry", "register_codec"]


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

    def codec_for(self, type_: type) -> _Codec | None:
        """The codec registered for exactly `type_`, or None."""
        return self._by_type.get(type_)

    def codec_named(self, name: str) -> _Codec | None:
        """The codec registered under `name`, or None."""
        return self._by_name.get(name)


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
