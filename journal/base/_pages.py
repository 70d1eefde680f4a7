"""The memory behind a payload view: what its reader may do with it once read.

An LMDB value's mapped pages are let go of as soon as they have been read (Linux, below). A buffer a
store fetched for one read (an object from a remote) is handed over instead: the reader keeps it,
and the decoder makes tensors that are views of it rather than copies (`owned_buffer`,
`HandedOver`).

A value read with ``buffers=True`` is a view into LMDB's read-only, shared file mapping. Every page
the digest and the decoder touch stays mapped, and counted in this process's RSS, until the
environment is closed: replaying an 86 MB payload held 86 MB of mapped file pages beside the 86 MB of
decoded tensors. ``madvise(MADV_DONTNEED)`` on a shared file mapping only drops this process's page
table entries: the data stays in the page cache (and on disk), and a later read of the same bytes
faults them back in. Nothing is written, so the journal cannot be harmed by it.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
from typing import Any, Callable, List, Optional, Tuple


__all__ = ["HANDED_OVER", "HandedOver", "MappedFile", "ReleaseBehind", "owned_buffer", "releaser"]

_MADV_DONTNEED = 4  # Linux; other systems give MADV_DONTNEED other meanings, so they get no releaser
_PAGE = mmap.PAGESIZE
# Below this a value's pages are not worth a system call.
_MIN_BYTES = 1 << 20
# Owned buffers from this size up are their own anonymous mapping (page-aligned), smaller ones bytearrays.
_OWNED_MAP_FROM = 1 << 20


class HandedOver:
    """The ``release`` of a view whose bytes are the reader's to keep.

    A store yields it beside a writable buffer it made for this one read and holds no reference to
    (`owned_buffer`), so the decoder may make tensors and arrays that are views of that buffer
    instead of copying them out (the buffer lives as long as any of them). Called as a release, it
    does nothing: there is no mapping to let go of.
    """

    def __call__(self, start: int, stop: int) -> None:
        return None

    def __repr__(self) -> str:
        return "HANDED_OVER"


HANDED_OVER = HandedOver()


def owned_buffer(nbytes: int) -> Any:
    """A new writable buffer of `nbytes` bytes: a ``bytearray``, or from a MiB up an anonymous mapping.

    A large one is a private anonymous mapping of its own (``mmap``, page-aligned): not zero-filled
    by us first as a ``bytearray`` is, given back to the system as soon as the last view of it goes,
    and left to the system's huge-page setting. numpy's large arrays ask for transparent huge pages,
    whose faults were erratic on this project's VM once its memory had churned (a cold replay of
    86 MB from a remote took 0.17-0.51 s in them, 0.17-0.22 s in 4 KiB pages: docs/performance.md).
    """
    if nbytes < _OWNED_MAP_FROM:
        return bytearray(nbytes)
    return mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)


def _load_madvise():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # the process's own symbols, libc's among them (no ldconfig run)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


_madvise = _load_madvise()


def _mapped_from(base: int, nbytes: int, path: str) -> bool:
    """True when [base, base + nbytes) lies in one read-only shared mapping of the file `path`."""
    return _mapping_of(base, nbytes, path) is not None


def _mapping_of(base: int, nbytes: int, path: str) -> Optional[Tuple[int, int]]:
    """The read-only shared mapping of the file `path` that holds [base, base + nbytes), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                fields = line.split(None, 5)
                if len(fields) < 6 or fields[5].rstrip("\n") != path:
                    continue
                start, end = (int(x, 16) for x in fields[0].split("-"))
                perms = fields[1]
                if start <= base and base + nbytes <= end:
                    return (start, end) if perms.startswith("r-") and perms[3] == "s" else None
    except (OSError, ValueError):
        return None
    return None


def _release_span(base: int, start: int, stop: int) -> None:
    first = -(-(base + start) // _PAGE) * _PAGE
    last = (base + stop) // _PAGE * _PAGE
    if last > first:
        _madvise(first, last - first, _MADV_DONTNEED)  # failure only means the pages stay mapped


class MappedFile:
    """Lets go of the whole pages of views into one file's read-only shared mapping, of any size.

    `releaser` looks the mapping up for each value (a read of ``/proc/self/maps``), which only pays
    for values of a MiB and more. A pass over many small values (`verify`) asks this instead: the
    mapping is looked up once and again only when a view lies outside it (the map grew).
    """

    def __init__(self, path: str) -> None:
        self._path = path
        self._span: Optional[Tuple[int, int]] = None

    def release(self, view) -> None:
        """Unmap the whole pages inside `view` (a ``buffers=True`` value read in a read transaction)."""
        if _madvise is None:
            return
        try:
            mv = memoryview(view)
            nbytes = mv.nbytes
            if nbytes < _PAGE or not mv.readonly:
                return
            base = _address(mv)
        except (TypeError, ValueError, BufferError):
            return
        span = self._span
        if span is None or not (span[0] <= base and base + nbytes <= span[1]):
            span = self._span = _mapping_of(base, nbytes, self._path)
            if span is None:
                return
        _release_span(base, 0, nbytes)


class _PyBuffer(ctypes.Structure):
    # CPython's Py_buffer (part of the stable ABI since 3.11).
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


def _address(mv: memoryview) -> int:
    """Where the buffer's bytes start in memory (a read-only buffer: ctypes' ``from_buffer`` refuses it).

    What it returns is only ever used once `_mapping_of` has found it inside the file's mapping.
    """
    view = _PyBuffer()
    _get_buffer(mv, ctypes.byref(view), 0)  # PyBUF_SIMPLE; through `pythonapi`, a failure raises its error
    try:
        return view.buf or 0
    finally:
        _release_buffer(ctypes.byref(view))


def releaser(view, path: str) -> Optional[Callable[[int, int], None]]:
    """A function ``release(start, stop)`` that unmaps the whole pages inside ``view[start:stop]``.

    Only for a view into a read-only shared mapping of the file `path` (an LMDB value read with
    ``buffers=True``), and only for bytes that will not be read again through it (each read would cost
    a page fault). Anything else (anonymous memory, where MADV_DONTNEED would discard data; other
    systems; small values) gets None, and releasing is simply skipped.
    """
    if _madvise is None:
        return None
    try:
        mv = memoryview(view)
        nbytes = mv.nbytes
        if nbytes < _MIN_BYTES or not mv.readonly:
            return None
        base = _address(mv)
    except (TypeError, ValueError, BufferError):
        return None
    if not _mapped_from(base, nbytes, path):
        return None

    def release(start: int, stop: int) -> None:
        _release_span(base, max(start, 0), min(stop, nbytes))

    return release


class ReleaseBehind:
    """Share one `release` between readers that each go through the bytes in ascending order.

    Each reader reports how far it has got; the pages every reader is past are released, once.
    """

    def __init__(self, release: Callable[[int, int], None], readers: int) -> None:
        self._release = release
        self._marks: List[int] = [0] * readers
        self._released = 0
        self._lock = threading.Lock()

    def reader(self, index: int) -> Callable[[int, int], None]:
        """The ``(start, stop)`` callback for reader `index`: it has read everything before `stop`."""

        def advance(start: int, stop: int) -> None:
            with self._lock:
                if stop > self._marks[index]:
                    self._marks[index] = stop
                low = min(self._marks)
                if low > self._released:
                    self._release(self._released, low)
                    self._released = low

        return advance
