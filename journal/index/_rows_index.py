"""The rows projection: the text ``stepjournal audit --json`` prints for each row, kept by every append.

``rows``: seq (`seq_key`) -> the row of the event at that seq (a call, or retention's release of a
record's payloads) as the verb prints it, without the layout: its compact JSON (`_row_text`), UTF-8. It
holds what the audit computes from more than the event itself: the provenance of a pulled event
(`_audit.Provenance`), and a record's ``released_by`` (the latest release of it, rewritten into the
record's row when the release is appended). So the verb lays the stored texts out (`_row_text.layout`,
in C), and its output is the one it prints from the log, byte for byte; `verify` compares the two. A
reader refuses stored text that is not a JSON object or holds a character a terminal acts on, which no
row this library writes holds.

``meta`` key `META_ROWS_INDEX`: ``b"<ROWS_FORMAT> <seq>"``, the format the rows are written in (the
audit schema version and the version of the stored text, `ROWS_FORMAT`) and the seq of the last event
folded in. The rows stand for the log when that seq is the log's last and the format is this library's;
otherwise ``audit --json`` reads the log, which gives the same output, slower. A library that does not
keep these rows (or writes another format) appends without them and leaves the seq behind; the next
append or writable open of this library folds in what it missed (`catch_up_in`). A log holding an event
that cannot be decoded keeps no rows (the value ``b"-"``): the verb reads the log and raises as it does
there; `reindex`, after the repair, builds them. `reindex` compares each row with the one the log gives
and writes only those that differ.
"""

from __future__ import annotations

import bisect
import itertools
import re
from typing import Any, Iterator, List, Optional, Tuple

import lmdb

from ._audit import AuditRecord, Provenance, RELEASED
from ._call_rows import MARKER_TAG, KeyRuleCache, checked_row
from ._import_map import ImportMap
from ._row_text import compact_text, compact_texts, layout
from ..base._errors import EventDecodeError, IntegrityError
from ..events._convert import event_of
from ..events._events import AUDIT_SCHEMA_VERSION, CALL_ACTIONS, Event, EventsImported, PayloadsReleased
from ..events._keys import META_ROWS_INDEX, seq_key, seq_of
from ..storage._store import Store

__all__ = ["ROWS_FORMAT", "RowsWriter", "apply_in", "catch_up_in", "covered_in", "stored_layout", "stored_rows"]

_UNBUILDABLE = b"-"
# The audit schema of the rows, then the version of their stored text (`_row_text`'s compact text): bump the
# second when what is stored for a row changes, so that rows of another format are rewritten, never printed.
ROWS_FORMAT = b"%d.3" % AUDIT_SCHEMA_VERSION
_BATCH = 2048
# In a stored row, ``released_by`` with the key after it, and what makes the row a record. A quote inside
# a string is escaped (\"), so a key's quotes, and these, never match inside a value.
_RELEASED_BY = re.compile(rb'"released_by":(?:null|\d+),"origin_journal":')
_GENERATED = b'"action":"generated",'


def covered_in(txn: lmdb.Transaction[Any], store: Store) -> Optional[int]:
    """The seq up to which the rows hold the log, in this library's format; None: no rows to use (the caller
    checks that the ``rows`` database exists, which a reader does as it reads it)."""
    raw = txn.get(META_ROWS_INDEX, db=store.db("meta"))
    if raw is None:
        return None
    written, _, seq = bytes(raw).partition(b" ")
    if written != ROWS_FORMAT or not seq.isdigit():
        return None
    return int(seq)


def _mark_in(txn: lmdb.Transaction[Any], store: Store, value: bytes) -> None:
    txn.put(META_ROWS_INDEX, value, db=store.db("meta"))


def _covering(seq: int) -> bytes:
    return b"%s %d" % (ROWS_FORMAT, seq)


def _row(seq: int, event: Event, provenance: Provenance) -> Optional[dict]:
    """The audit row of the event at `seq` as read from the log (`event` as stored, not translated), or None."""
    if type(event) not in CALL_ACTIONS and not isinstance(event, PayloadsReleased):
        return None
    row = AuditRecord.from_event(seq, event).to_json()
    _with_origin(row, provenance)
    return row


def _with_origin(row: Any, provenance: Provenance) -> None:
    """Set a pulled row's origin journal and seq, and its ``source_seq`` as this journal's (`call_records`)."""
    found = provenance.of(row["seq"], row["source_seq"])
    if found is not None:
        row["origin_journal"], row["origin_seq"], row["source_seq"] = found


class RowsWriter:
    """Writes rows in log order inside one write transaction: a batch's texts at once (`add`), an event's
    row as it comes (`event`), and a release's rewrite of its record's row."""

    def __init__(self, txn: lmdb.Transaction[Any], store: Store, imports: Optional[ImportMap] = None, *,
                 rewrite: bool = False) -> None:
        db = store.db("rows")
        assert db is not None  # made only where the rows are: `apply_in` and `catch_up_in` return first otherwise
        self.txn, self.store, self.db = txn, store, db
        self.provenance = Provenance(imports)
        self.keys = KeyRuleCache()  # the key rule's answers, for `checked_row` over a log (catch-up)
        self.pending: List[Any] = []
        self.seqs: List[int] = []  # the pending rows' seqs
        # `rewrite` (reindex): the rows stay and are compared with the log's a batch at a time; only a row that
        # differs is written, and a stored row no event gives is deleted, so that a rebuild of intact rows
        # dirties no page (rewriting every row would make each reindex slower than the last: LMDB allocates
        # from the growing list of the pages the one before freed). `next`: the first seq not compared yet.
        self.rewrite, self.next = rewrite, 0
        self.cursor = txn.cursor(db=self.db) if rewrite else None

    def add(self, seq: int, row: Any) -> None:
        """The row (`_native_rows.Row` or dict) of the event at `seq`, the next one; its provenance not applied yet
        (`flush` applies it)."""
        self.pending.append(row)
        self.seqs.append(seq)
        if len(self.seqs) >= _BATCH:
            self.flush()

    def event(self, seq: int, event: Event) -> None:
        """The event at `seq`, as stored (a pulled one not translated): its row, and a release's rewrite. The
        row is written by the standard library's encoder (`compact_text`): an append imports no msgspec."""
        if isinstance(event, EventsImported):
            self.provenance.marker(seq, event)
            return
        row = _row(seq, event, self.provenance)
        if row is None:
            return
        self.flush()
        self._put(seq, compact_text(row))
        if row["action"] == RELEASED and row["source_seq"] is not None:
            self._released(row["source_seq"], seq)

    def finish(self, last: int, *, damaged: bool = False) -> None:
        """The rows hold the log up to `last` (`damaged`: an event was left out; then no rows are kept)."""
        if damaged:
            self.pending, self.seqs = [], []
            self.txn.drop(self.db, delete=False)
            _mark_in(self.txn, self.store, _UNBUILDABLE)
            return
        self.flush()
        if self.rewrite:
            self._delete_from(self.next)
        _mark_in(self.txn, self.store, _covering(last))

    def flush(self) -> None:
        if not self.pending:
            return
        rows, seqs, self.pending, self.seqs = self.pending, self.seqs, [], []
        if self.provenance:  # looked up by seq: a marker folded after a row was added does not cover it
            for row in rows:
                _with_origin(row, self.provenance)
        if self.rewrite:
            self._rewrite(seqs, compact_texts(rows))
            return
        put, db = self.txn.put, self.db
        for seq, text in zip(seqs, compact_texts(rows)):
            if not put(seq_key(seq), text, db=db, append=True):
                self._refused(seq)

    def _put(self, seq: int, text: bytes) -> None:
        if self.rewrite:
            self._rewrite([seq], [text])
        elif not self.txn.put(seq_key(seq), text, db=self.db, append=True):
            self._refused(seq)

    def _rewrite(self, seqs: List[int], texts: List[bytes]) -> None:
        """Make the stored rows from `next` through ``seqs[-1]`` the given ones (`seqs` ascending): one read of
        that range, and writes only where it differs."""
        keys = [seq_key(seq) for seq in seqs]
        last, stored_keys, stored = keys[-1], [], []
        cur = self.cursor
        assert cur is not None  # only a rewriting writer rewrites, and it has the cursor
        if cur.set_range(seq_key(self.next)):
            for key, text in cur:
                if key > last:
                    break
                stored_keys.append(key)
                stored.append(text)
        self.next = seqs[-1] + 1
        if stored_keys == keys and stored == texts:
            return
        have = dict(zip(stored_keys, stored))
        for key in set(have).difference(keys):
            self.txn.delete(key, db=self.db)
        for key, text in zip(keys, texts):
            if have.get(key) != text:
                self.txn.put(key, text, db=self.db)

    def _delete_from(self, seq: int) -> None:
        """Delete the stored rows at `seq` and past it (a rewrite's rows the log no longer gives)."""
        cur = self.cursor
        assert cur is not None  # only a rewriting writer deletes, and it has the cursor
        found = cur.set_range(seq_key(seq))
        while found:
            cur.delete()  # moves to the next row; past the last, the cursor holds no key
            found = bool(cur.key())

    @staticmethod
    def _refused(seq: int) -> None:
        raise IntegrityError(f"the audit rows already hold a row at or past #{seq}; run `stepjournal reindex`")

    def _released(self, record_seq: int, release_seq: int) -> None:
        """The record's row says the release (the latest one wins, as `audit` says); a row that is no record stays."""
        key = seq_key(record_seq)
        found = self.txn.get(key, db=self.db)  # a view in a transaction that hands out buffers: bytes below
        if found is None or _GENERATED not in bytes(found):
            return
        text = _RELEASED_BY.sub(b'"released_by":%d,"origin_journal":' % release_seq, bytes(found), count=1)
        self.txn.put(key, text, db=self.db)


def apply_in(txn: lmdb.Transaction[Any], store: Store, appended: List[Tuple[int, Event]],
             imports: Optional[ImportMap], bodies: Optional[List[bytes]] = None) -> None:
    """Fold appended events (seq, event as stored) into the rows, in the transaction that appends them.

    `imports`: the journal's pulled blocks, for a pull; None for a local append, whose events are in no
    pulled block and whose releases name their records by this journal's seqs. `bodies`: the events'
    stored bytes, when at hand: a call's row is then decoded from them in C (`checked_row`, as a catch-up
    does: the same row as from the event) instead of built from the event in Python. First what another
    library appended without the rows."""
    if not appended or store.db("rows") is None:
        return
    covered = covered_in(txn, store)
    if covered is None:
        return  # not built: the writable open builds them
    if covered < appended[0][0] - 1:
        catch_up_in(txn, store, until=appended[0][0] - 1)
    writer = RowsWriter(txn, store, imports)
    for at, (seq, event) in enumerate(appended):
        if bodies is not None and type(event) in CALL_ACTIONS:
            row, _found = checked_row(seq, bytes(bodies[at]), writer.keys)
            if row is not None:
                writer.add(seq, row)
                continue
        writer.event(seq, event)
    writer.flush()
    _mark_in(txn, store, _covering(appended[-1][0]))


def catch_up_in(txn: lmdb.Transaction[Any], store: Store, until: Optional[int] = None, *, build: bool = False) -> None:
    """Fold in the events the rows lack, up to `until` (None: the log's end); with `build`, start the rows of
    a journal that has none (its writable open). An event that cannot be decoded leaves the journal without rows."""
    db = store.db("rows")
    if db is None:
        return
    covered = covered_in(txn, store)
    if covered is None:
        raw = txn.get(META_ROWS_INDEX, db=store.db("meta"))
        if not build or (raw is not None and bytes(raw) == _UNBUILDABLE):
            return
        txn.drop(db, delete=False)
        covered = 0
    cur = txn.cursor(db=store.db("events"))
    end = seq_of(cur.key()) if cur.last() else 0
    end = end if until is None else min(until, end)
    if covered >= end:
        _mark_in(txn, store, _covering(covered))  # a journal's first open: rows of nothing, kept from now on
        return
    writer = RowsWriter(txn, store)
    for key, body in txn.cursor(db=store.db("events")):
        seq = seq_of(key)
        if seq > end:
            break
        body = bytes(body)  # a view, in a transaction that hands out buffers (an append's)
        if seq <= covered:
            # before the rows' end only the markers matter (a byte search picks a superset of them)
            if MARKER_TAG in body:
                event = _decoded(body, seq)
                if isinstance(event, EventsImported):
                    writer.provenance.marker(seq, event)
            continue
        row, found = checked_row(seq, body, writer.keys)
        if row is not None:
            writer.add(seq, row)
            continue
        event = _decoded(body, seq, found)
        if event is None:
            writer.finish(end, damaged=True)
            return
        writer.event(seq, event)
    writer.finish(end)


def _decoded(body: bytes, seq: int, found: Optional[tuple] = None) -> Optional[Event]:
    try:
        return event_of(body, found, seq=seq)
    except EventDecodeError:
        return None


def stored_rows(store: Store, last_seq: int, *, seqs: bool = False, checked: bool = True,
                whole: bool = False) -> Optional[Iterator[Any]]:
    """The stored rows' compact texts in log order (with `seqs`: (seq, text) pairs), each batch checked
    (`_checked`; not for `verify`, which compares each with the log's), when they hold the log up to
    `last_seq` (the log's last seq as the caller read it); None otherwise (read the log). With `whole`
    (`verify`), every stored row, those past `last_seq` too: a row no event gives there would refuse the
    append that reaches its seq."""
    batches = _batches(store, last_seq, whole=whole)
    if batches is None:
        return None

    def rows() -> Iterator[Any]:
        for batch in batches:
            if checked:
                _checked(batch)
            if seqs:
                yield from ((seq_of(key), text) for key, text in batch)
            else:
                yield from (text for _key, text in batch)

    return rows()


def stored_layout(store: Store, last_seq: int, limit: Optional[int] = None) -> Optional[Iterator[bytes]]:
    """The stored rows laid out as ``audit --json`` prints them: per batch, the body of the array (rows joined
    by ``,\n``), at most `limit` rows; None as `stored_rows`."""
    batches = _batches(store, last_seq, limit)
    return None if batches is None else (_checked(batch) for batch in batches)


def _batches(store: Store, last_seq: int, limit: Optional[int] = None, *,
             whole: bool = False) -> Optional[Iterator[List[Tuple[bytes, bytes]]]]:
    with store.read() as txn:
        covered = covered_in(txn, store)
    if covered is None or covered < last_seq:
        return None
    # Checked as read, the log's tree is checked whole first, as a read of the log would check it: the rows
    # of a log whose pages are damaged are refused in the same words (what an event's bytes hold is verify's).
    store.db("events")
    return _read(store, None if whole else covered, limit)


def _checked(batch: List[Tuple[bytes, bytes]]) -> bytes:
    """The batch laid out (`_row_text.layout`); a row this library would not have written is refused."""
    body = layout([text for _key, text in batch])
    if body is None:
        seq = next((seq_of(key) for key, text in batch if layout([text]) is None), seq_of(batch[0][0]))
        raise IntegrityError(
            f"audit row #{seq} is not a row this library writes (not one JSON object, or it holds a character a "
            "terminal acts on): the rows were changed outside stepjournal. Run `stepjournal verify`, then "
            "`stepjournal reindex` (it rebuilds them from the log)")
    return body


def _read(store: Store, last: Optional[int], limit: Optional[int]) -> Iterator[List[Tuple[bytes, bytes]]]:
    """The rows up to seq `last` (None: all of them, from the first key; at most `limit`), in batches of `_BATCH`,
    each read in a transaction of its own."""
    lo, end, left = (b"", None, limit) if last is None else (seq_key(1), seq_key(last), limit)
    while left is None or left > 0:
        size = _BATCH if left is None else min(_BATCH, left)
        with store.read() as txn:
            db = store.db("rows")  # checked as read: the whole tree, once (the verb reads all of it)
            if db is None:  # a meta key without its database: damage, which `verify` names
                raise IntegrityError("the journal's meta says it keeps audit rows, but it has no `rows` database; "
                                     "run `stepjournal verify`, then `stepjournal reindex`")
            cur = txn.cursor(db=db)
            batch = list(itertools.islice(cur.iternext(), size)) if cur.set_range(lo) else []
        # rows a writer appended since: not the log this read began on
        if batch and end is not None and batch[-1][0] > end:
            batch = batch[:bisect.bisect_right([key for key, _text in batch], end)]
        if batch:
            yield batch
        if len(batch) < size:
            return
        lo = seq_key(seq_of(batch[-1][0]) + 1)
        left = None if left is None else left - len(batch)
