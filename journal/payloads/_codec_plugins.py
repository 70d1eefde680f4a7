"""Codec plugins: the codec an installed distribution ships for a type or a codec name, found by entry point.

A value of a type that has no codec in a registry, or a payload naming a codec that is not registered,
is looked up here before it is refused. Two entry-point groups index the same registering functions:

- ``stepjournal.codecs`` (`TYPE_GROUP`): the entry point's name is a type's qualified name,
  ``type.__module__ + "." + type.__qualname__`` (``verl.protocol.DataProto``). Encoding a value of that
  type, or of a subclass (the type's bases are looked up too), loads it.
- ``stepjournal.codec_names`` (`NAME_GROUP`): the entry point's name is the codec name that payloads
  store (``verl.DataProto``). Decoding such a payload loads it.

Both point at a function ``register(registry)`` that registers its codecs into the `CodecRegistry`
it is handed (`register_codec`'s arguments, on that registry). A distribution declares both entries of
each codec it ships; a test checks that stepjournal's own agree. An entry point is imported once per
process and run once per registry; when it fails, every use of its codec raises `CodecPluginError`
naming it (one warning is logged the first time), never a silent miss.

Only entry points of installed distributions run, each only when its name is asked for: a payload
naming ``verl.DataProto`` imports the verl adapter, as ``import stepjournal.adapters.verl`` would.
This module imports `importlib.metadata` on the first miss, not before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..base._errors import CodecPluginError
from ..base._log import get_logger

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["TYPE_GROUP", "NAME_GROUP", "entry_points_named", "run_plugin", "raise_again"]

log = get_logger(__name__)

TYPE_GROUP = "stepjournal.codecs"
NAME_GROUP = "stepjournal.codec_names"

_lock = threading.Lock()
# group -> entry-point name -> the entry points of that name (one, unless two distributions clash).
_index: dict[str, dict[str, tuple[Any, ...]]] = {}
# (group, name, target) -> the imported function, or the CodecPluginError its import raised.
_imported: dict[tuple[str, str, str], Any] = {}


def entry_points_named(group: str, name: str) -> tuple[Any, ...]:
    """The installed entry points of `group` named `name` (read from the metadata once per process)."""
    index = _index.get(group)
    if index is None:
        from importlib.metadata import entry_points

        found: dict[str, list[Any]] = {}
        for ep in entry_points(group=group):
            found.setdefault(ep.name, []).append(ep)
        with _lock:
            index = _index.setdefault(group, {key: tuple(eps) for key, eps in found.items()})
    return index.get(name, ())


def _failure(group: str, ep: "EntryPoint", wanted: str, error: str) -> CodecPluginError:
    dist = getattr(ep, "dist", None)
    distribution, version = (None, None) if dist is None else (dist.name, dist.version)
    where = "an unknown distribution" if distribution is None else f"distribution {distribution} {version}"
    return CodecPluginError(
        f"the codec for {wanted} comes from the codec plugin {ep.name!r} (entry point {ep.value} in group "
        f"{group}, {where}), which failed: {error}. Install what it needs, or reinstall "
        f"{distribution or 'the distribution that declares it'}; or register the codec yourself with "
        "stepjournal.payloads.register_codec before storing or loading such values",
        group=group, entry_point=ep.name, target=ep.value, distribution=distribution, version=version,
        error=error,
    )


def raise_again(exc: CodecPluginError) -> CodecPluginError:
    """A fresh copy of a remembered failure, to raise each time its codec is asked for."""
    return CodecPluginError(
        str(exc), group=exc.group, entry_point=exc.entry_point, target=exc.target,
        distribution=exc.distribution, version=exc.version, error=exc.error,
    )


def _hook(group: str, ep: "EntryPoint", wanted: str) -> Callable[[Any], None]:
    key = (group, ep.name, ep.value)
    hook = _imported.get(key)
    if hook is None:
        try:
            hook = ep.load()
        except Exception as exc:  # a plugin's import can fail in any way: name it and its distribution
            hook = _failure(group, ep, wanted, f"importing it raised {type(exc).__name__}: {exc}")
        else:
            if not callable(hook):
                why = f"it names a {type(hook).__name__}, not a function that takes a CodecRegistry"
                hook = _failure(group, ep, wanted, why)
        _imported[key] = hook
    if isinstance(hook, CodecPluginError):
        raise raise_again(hook)
    return hook


def run_plugin(group: str, ep: "EntryPoint", registry: Any, wanted: str, registered: Callable[[], bool]) -> None:
    """Import the entry point's function and run it on `registry`; check that it registered `wanted`.

    Args:
        group: `TYPE_GROUP` or `NAME_GROUP`.
        ep: the entry point.
        registry: the `CodecRegistry` the function registers into.
        wanted: what was looked up, for messages (``"verl.protocol.DataProto"``, ``"codec 'verl.DataProto'"``).
        registered: says whether `wanted` is registered now.

    Raises:
        CodecPluginError: the import or the function failed, or it did not register `wanted`.
    """
    try:
        hook = _hook(group, ep, wanted)
        try:
            hook(registry)
        except Exception as exc:  # a plugin's function can fail in any way (a ValueError from register ...)
            raise _failure(group, ep, wanted, f"registering raised {type(exc).__name__}: {exc}") from exc
        if not registered():
            raise _failure(group, ep, wanted, f"it ran but registered no codec for {wanted}")
    except CodecPluginError as exc:
        log.warning(
            "codec_plugin_failed", group=group, entry_point=ep.name, target=ep.value,
            distribution=exc.distribution, error=exc.error,
        )
        raise
    log.debug("codec_plugin_loaded", group=group, entry_point=ep.name, target=ep.value)
