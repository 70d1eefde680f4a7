"""`CodecRegistry`: codecs for custom payload types, registered by a stable name that payloads store."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import attrs

from ._codec_plugins import NAME_GROUP, TYPE_GROUP, entry_points_named, raise_again, run_plugin
from ..base._errors import CodecPluginError

__all__ = ["CodecRegistry", "default_registry", "register_codec"]


_NO_PLUGIN_MAX = 4096


@attrs.frozen
class _Codec:
    type_: type
    name: str
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


class CodecRegistry:
    """Codecs for custom types, each under a stable name that payloads store instead of code.

    Lookup is by exact type: a subclass of a registered type needs its own registration (it is not
    stored as its base class, which is what it would come back as).

    A lookup that finds nothing first runs the codec plugins installed for it, once (docs/journal.md,
    "Codecs that load themselves"): the entry points of group ``stepjournal.codecs`` named after the
    type or one of its bases, or of ``stepjournal.codec_names`` named after the codec name.

    Args:
        autoload: run installed codec plugins on a miss (the default); False keeps the registry to
            what was registered into it by hand.
    """

    def __init__(self, *, autoload: bool = True) -> None:
        self._by_type: dict[type, _Codec] = {}
        self._by_name: dict[str, _Codec] = {}
        self._lock = threading.Lock()
        self._autoload = autoload
        # (group, entry-point name, target) -> None once run, or the CodecPluginError it raised.
        self._plugins: dict[tuple[str, str, str], CodecPluginError | None] = {}
        # Reentrant: a plugin's import may itself encode a value and look up a codec.
        self._plugin_lock = threading.RLock()
        # Types whose class and bases no installed plugin is named after: a miss on them (a diff asks
        # for every value it compares) is one set lookup, not a walk of the bases. Bounded, so classes
        # made on the fly are not kept alive without end.
        self._no_plugin: set[type] = set()

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
        from ._codec_format import is_native_type, type_name  # torch: a registry is made without it

        if is_native_type(type_):
            raise ValueError(f"{type_name(type_)} is stored natively by stepjournal; it cannot take a codec")
        with self._lock:
            by_name = self._by_name.get(name)
            by_type = self._by_type.get(type_)
            if by_name is not None and by_name is by_type:
                return
            if by_name is not None:
                raise ValueError(
                    f"codec name {name!r} is already registered for {type_name(by_name.type_)}; "
                    "pick another name"
                )
            if by_type is not None:
                raise ValueError(
                    f"{type_name(type_)} already has a codec named {by_type.name!r}; "
                    "a type has exactly one name"
                )
            codec = _Codec(type_, name, encode, decode)
            self._by_type[type_] = codec
            self._by_name[name] = codec

    def copy(self) -> CodecRegistry:
        """Return a new registry holding the same codecs, to extend without touching this one."""
        other = CodecRegistry(autoload=self._autoload)
        with self._lock, self._plugin_lock:
            other._by_type = dict(self._by_type)
            other._by_name = dict(self._by_name)
            other._plugins = dict(self._plugins)
        return other

    def __contains__(self, name: object) -> bool:
        """Whether a codec is registered under `name` now (runs no plugin)."""
        return name in self._by_name

    def codec_for(self, type_: type) -> _Codec | None:
        """The codec registered for exactly `type_`, or None.

        On a miss, first runs the codec plugins named after `type_` and its bases.

        Raises:
            CodecPluginError: such a plugin failed (now or before); the message names it.
        """
        codec = self._by_type.get(type_)
        if codec is None and self._autoload and type_ not in self._no_plugin:
            from ._codec_format import type_name

            named = False
            for base in type_.__mro__[:-1]:  # not `object`
                name = type_name(base)
                registered = functools.partial(self._by_type.__contains__, base)
                named = self._run_plugins(TYPE_GROUP, name, name, registered) or named
            if not named:
                if len(self._no_plugin) >= _NO_PLUGIN_MAX:
                    self._no_plugin.clear()
                self._no_plugin.add(type_)
            codec = self._by_type.get(type_)
        return codec

    def codec_named(self, name: str) -> _Codec | None:
        """The codec registered under `name`, or None.

        On a miss, first runs the codec plugins named `name`.

        Raises:
            CodecPluginError: such a plugin failed (now or before); the message names it.
        """
        codec = self._by_name.get(name)
        if codec is None and self._autoload:
            self._run_plugins(NAME_GROUP, name, f"codec {name!r}", lambda: name in self._by_name)
            codec = self._by_name.get(name)
        return codec

    def _run_plugins(self, group: str, name: str, wanted: str, registered: Callable[[], bool]) -> bool:
        """Run the plugins of `group` named `name` not run yet; say whether there are any."""
        eps = entry_points_named(group, name)
        for ep in eps:
            key = (group, name, ep.value)
            with self._plugin_lock:
                if key in self._plugins:
                    failed = self._plugins[key]
                    if failed is not None:
                        raise raise_again(failed)
                    continue
                self._plugins[key] = None
                try:
                    run_plugin(group, ep, self, wanted, registered)
                except CodecPluginError as exc:
                    self._plugins[key] = exc
                    raise
        return bool(eps)


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
