"""What to do about a value no payload can hold: the hint an `UnsupportedValueError` ends with.

A codec turns *data* into a payload. Some values are not data at all (a function, an open file, a
socket, a lock, a generator): no codec can store them, and suggesting `register_codec` for one sends
the user the wrong way. For those the hint says what to return instead; `register_codec` is
suggested for instances of other classes (the user's own types, a library's data types).
"""

from __future__ import annotations

import functools
import io
import socket
import threading
import types

__all__ = ["storing_hint"]

_FUNCTION_TYPES = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.MethodWrapperType,
    types.WrapperDescriptorType,
    types.MethodDescriptorType,
    functools.partial,
)
_LOCK_TYPES = (
    type(threading.Lock()),
    type(threading.RLock()),
    threading.Condition,
    threading.Semaphore,
    threading.Event,
    threading.Barrier,
)


def _not_data(value: object) -> str | None:
    """Advice for a value that is not data (no codec can store it), or None for one that is."""
    if isinstance(value, type):
        return (f"a class is code, not data: store its name instead "
                f"({value.__module__ + '.' + value.__qualname__!r})")
    if isinstance(value, _FUNCTION_TYPES):
        what = "a lambda" if getattr(value, "__name__", "") == "<lambda>" else "a function"
        return f"{what} is code, not data: return what it computes (call it), or its name as a str"
    if isinstance(value, types.ModuleType):
        return f"a module is code, not data: store its name ({value.__name__!r}) instead"
    if isinstance(value, io.IOBase) or isinstance(getattr(value, "file", None), io.IOBase):
        return "an open file is a handle, not data: return its contents (f.read()) or its path (f.name)"
    if isinstance(value, (types.CoroutineType, types.AsyncGeneratorType)):
        return "a coroutine or async generator has not run yet: await it and return its result"
    if isinstance(value, types.GeneratorType) or (hasattr(value, "__next__") and hasattr(value, "__iter__")):
        return "a generator or iterator hands out its items lazily: return list(...) of it"
    if isinstance(value, socket.socket):
        return "a socket is a connection, not data: return the bytes it received, or its address"
    if isinstance(value, _LOCK_TYPES):
        return "a lock or another thread primitive holds no data: leave it out of what is stored"
    return None


def storing_hint(value: object) -> str:
    """The sentence that says how to store `value`, or what to store in its place."""
    advice = _not_data(value)
    if advice is not None:
        return f"No codec can store it: {advice}"
    name = type(value).__name__
    hint = (
        f"To store it, register a codec: stepjournal.payloads.register_codec({name}, \"mypackage.{name}\", "
        "encode=..., decode=...)"
    )
    if isinstance(value, (set, frozenset)):
        hint = f"Store it as a list (sorted(...) keeps it stable), or: {hint[0].lower()}{hint[1:]}"
    return hint
