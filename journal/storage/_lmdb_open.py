"""Open LMDB environments and named databases while other processes grow the map.

LMDB reads the map's size when an environment opens and refuses a transaction (`MDB_MAP_RESIZED`)
once another process has committed past that size. py-lmdb begins a transaction inside `lmdb.open`,
so a growth committed between the two fails the open itself. Both calls here open again, which
reads the size the other process committed; the map only grows, so a few tries settle it.
"""

from __future__ import annotations

import os
from typing import Dict

import lmdb

from ..base._errors import JournalError

__all__ = ["open_env", "open_db"]

_TRIES = 8


def open_env(path: str, key: str, map_size: int, options: Dict[str, object]) -> lmdb.Environment:
    """`lmdb.open(key, ...)`, opened again while another process grows the map (`path` names it in errors).

    The path is given as bytes: py-lmdb encodes a str path as strict UTF-8, which a folder name that is
    not UTF-8 (its bytes kept in the str as surrogates) cannot be."""
    for _ in range(_TRIES):
        try:
            return lmdb.open(os.fsencode(key), map_size=map_size, **options)
        except lmdb.MapResizedError:
            continue
    raise _resizing(path)


def open_db(env: lmdb.Environment, name: str, *, create: bool, path: str):
    """The named database `name` (None when absent and not created), adopting a grown map as it opens."""
    for _ in range(_TRIES):
        try:
            return env.open_db(name.encode(), create=create)
        except lmdb.NotFoundError:
            return None
        except lmdb.MapResizedError:
            env.set_mapsize(0)  # 0: the size the other process committed
    raise _resizing(path)


def _resizing(path: str) -> JournalError:
    return JournalError(
        f"journal {path!r} was resized by another process {_TRIES} times while this one opened it; "
        "open it again once that process's growth settles"
    )
