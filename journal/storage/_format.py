"""The journal's on-disk format, read at every open: a newer one is refused rather than misread or damaged.

A journal's ``meta`` database holds its format (``format``, this library's `JOURNAL_FORMAT` when it
created it), the oldest format whose libraries still read it rightly (``read_format``; absent: the
format itself) and the stepjournal version that last opened it for writing (``written_by``). Like
SQLite's read and write versions: a library whose format is older than ``format`` never writes the
journal; it reads it only when ``read_format`` is its own format or older (a format that adds what an
older reader may ignore says so), and then warns once, naming the version that wrote it.
"""

from __future__ import annotations

import re
from typing import Any, Optional

import lmdb

from ..base._errors import IntegrityError, JournalFormatError
from ..base._log import get_logger
from ..base._version import JOURNAL_FORMAT, __version__
from ..events._keys import META_FORMAT, META_READ_FORMAT, META_WRITTEN_BY

__all__ = ["check_format_in", "check_format_of", "mark_format_in", "is_new_in"]

log = get_logger(__name__)

_VERSION_TEXT = re.compile(r"[0-9A-Za-z.+!_-]{1,40}")
# How this library writes a format: str() of an int from 1. int() would also take "-1", "0", " 1" or
# "1_0", and a "-1" would pass as older than this library's format and be written to.
_FORMAT_TEXT = re.compile(rb"[1-9][0-9]{0,17}")


def check_format_in(txn: lmdb.Transaction[Any], meta: Optional[lmdb._Database], path: str, *,
                    writing: bool) -> None:
    """Refuse a journal whose format is newer than this library's: for writing always, for reading
    unless it says this library reads it rightly (then warn, naming the version that wrote it).

    Args:
        txn: a transaction of the journal; meta: its ``meta`` database (None: not made yet).
        path: the journal, for messages.
        writing: whether the open writes.

    Raises:
        JournalFormatError: naming the journal's format, the version that wrote it and what to do.
        IntegrityError: ``format`` or ``read_format`` is not a format number (decimal digits, 1 or more).
    """
    found = _number(txn, meta, META_FORMAT)
    if found is None or found <= JOURNAL_FORMAT:
        return
    readable = _number(txn, meta, META_READ_FORMAT)
    readable = found if readable is None else readable
    raw = txn.get(META_WRITTEN_BY, db=meta)
    text = bytes(raw).decode("utf-8", "replace") if raw is not None else ""
    written_by = text if _VERSION_TEXT.fullmatch(text) else None
    by = f"stepjournal {written_by}" if written_by else "a newer stepjournal (its version is not recorded)"
    fix = (f"use stepjournal {written_by} or newer" if written_by else "use the stepjournal that wrote it") + (
        ", installed from the clone or wheel that wrote the journal")
    if writing or readable > JOURNAL_FORMAT:
        harm = "would damage it by writing" if writing else "would misread it"
        hint = "; or open it read-only to read it" if writing and readable <= JOURNAL_FORMAT else ""
        raise JournalFormatError(
            f"journal {path!r} is in format {found}, written by {by}; this stepjournal ({__version__}) knows "
            f"format {JOURNAL_FORMAT} and {harm}. To {'write' if writing else 'read'} it, {fix}{hint}",
            format=found, written_by=written_by,
        )
    log.warning("journal_format_newer", path=path, format=found, written_by=written_by, library_version=__version__,
                hint=f"read as format {JOURNAL_FORMAT}: what the newer format adds is not shown; {fix}")


def check_format_of(env: lmdb.Environment, path: str, *, writing: bool) -> None:
    """`check_format_in` for an LMDB environment opened outside a `Store` (compaction's own)."""
    with env.begin() as txn:
        try:
            meta = env.open_db(b"meta", txn=txn, create=False)
        except lmdb.NotFoundError:
            return  # no meta yet: nothing newer
        check_format_in(txn, meta, path, writing=writing)


def is_new_in(txn: lmdb.Transaction[Any], meta: lmdb._Database, events: lmdb._Database, path: str) -> bool:
    """Whether the journal is new (no ``format`` yet), for a writable open.

    Raises:
        IntegrityError: it holds events but no ``format``: taken for new, its format and key layout
            would be stamped as this library's over events of a format nobody knows.
    """
    if txn.get(META_FORMAT, db=meta) is not None:
        return False
    if events is not None and txn.cursor(db=events).first():
        raise IntegrityError(
            f"journal {path!r} holds events but no format in its meta: it is damaged or was not written by "
            "stepjournal, and is not written to. Restore it from a copy; a read-only open still reads it"
        )
    return True


def mark_format_in(txn: lmdb.Transaction[Any], meta: lmdb._Database, *, new: bool) -> None:
    """Write this library's format into a new journal, and this version as the last to write the journal."""
    if new:
        txn.put(META_FORMAT, str(JOURNAL_FORMAT).encode(), db=meta)
    stored = txn.get(META_WRITTEN_BY, db=meta)
    if stored is None or bytes(stored) != __version__.encode():
        txn.put(META_WRITTEN_BY, __version__.encode(), db=meta)


def _number(txn: lmdb.Transaction[Any], meta: Optional[lmdb._Database], key: bytes) -> Optional[int]:
    if meta is None:  # not made yet: no format is written (db=None would read LMDB's main database)
        return None
    raw = txn.get(key, db=meta)
    if raw is None:
        return None
    if _FORMAT_TEXT.fullmatch(bytes(raw)) is None:
        raise IntegrityError(
            f"the journal's meta key {key.decode()!r} holds {bytes(raw)[:20]!r}, not a format number (1 or more)"
        )
    return int(bytes(raw))
