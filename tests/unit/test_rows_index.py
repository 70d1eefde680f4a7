"""The rows projection: the ``audit --json`` text each append keeps is what the log gives, byte for byte, in
every journal it holds; where it does not hold the log, the verb reads the log; `verify` names a row that
differs, and `reindex` mends it."""

from __future__ import annotations

import io
import json
import re
import shutil
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from test_call_rows import append_raw, call, journal_path, packed  # noqa: F401 (journal_path: a fixture)

from lmdb_raw import delete_raw, items, put_raw
from stepjournal import Journal
from stepjournal.errors import EventDecodeError, IntegrityError
from stepjournal.adapters.cli._audit import _print_json_rows, _print_laid_out  # private: a CLI helper under test
from stepjournal.adapters.cli._render import print_json  # private: a CLI helper under test
from stepjournal.events._keys import META_ROWS_INDEX, seq_key  # private: the key layout itself
from stepjournal.tools import json_rows, releases_of
from stepjournal.index._rows_index import ROWS_FORMAT  # private: the rows projection's format

DATA = Path(__file__).parent.parent / "data"


@pytest.fixture
def copy(journal_path, tmp_path) -> str:
    path = tmp_path / "j"
    shutil.copytree(journal_path, path)
    return str(path)


def stored_text(journal: Journal) -> str:
    """What ``audit --json`` prints from the rows projection (it must hold the log)."""
    bodies = journal.stored_audit_rows(laid_out=True)
    assert bodies is not None, "the rows projection does not hold the log"
    out = io.StringIO()
    with redirect_stdout(out):
        _print_laid_out(bodies)
    rows = journal.stored_audit_rows()  # each row's compact JSON: the same rows
    assert [json.loads(text) for text in rows] == json.loads(out.getvalue() or "[]")
    return out.getvalue()


def logs_text(journal: Journal) -> str:
    """What ``audit --json`` prints from the log: `Journal.audit`'s records (the event path, ``released_by``
    set), printed as a list; the verb's own read of the log prints the same."""
    out, streamed = io.StringIO(), io.StringIO()
    with redirect_stdout(out):
        print_json([record.to_json() for record in journal.audit()])
    with redirect_stdout(streamed):
        _print_json_rows(json_rows(journal.raw_events(), native=True, released_by=releases_of(journal.raw_events())))
    assert out.getvalue() == streamed.getvalue()
    return out.getvalue()


def test_the_rows_every_kind_of_append_kept_print_what_the_log_gives(journal_path, copy):
    with Journal(journal_path, readonly=True) as journal:
        printed = stored_text(journal)
        assert printed == logs_text(journal)
    # records, replays, bypasses, refusals, stages, modes, a release (its record says released_by),
    # pulled calls with their origin, and text a terminal would act on (escaped)
    for part in ('"action": "released"', '"released_by": 1', '"origin_journal": "', '"action": "refused"',
                 '"stage": "reward"', '"mode": "validate"', "\\u001b[31m", "\u2028"):
        assert part in printed
    with Journal(copy) as journal:
        journal.reindex()
        assert stored_text(journal) == printed  # the rebuild's rows are the appends' rows


def test_a_release_rewrites_its_records_row_and_a_later_release_replaces_it(copy):
    from stepjournal.upkeep import Retention, prune

    with Journal(copy, run="exp") as journal:
        before = stored_text(journal)
        journal.record(20, b"again")
        prune(journal, Retention(keep_last=1))
        after = stored_text(journal)
        assert after == logs_text(journal)
    released = re.compile(r'"released_by": \d+')
    assert len(released.findall(after)) > len(released.findall(before))


def test_after_a_library_without_the_rows_appended_the_log_is_read_until_a_writer_folds_it_in(copy):
    bypass = packed({**call, "run": "exp", "step": 30, "reason": "appended by another library"})
    with Journal(copy, session=False) as journal:
        append_raw(journal, [bypass])  # the event alone: no projection kept it
    with Journal(copy, readonly=True) as journal:
        assert journal.stored_audit_rows() is None  # the rows stop short of the log: the verb reads the log
    with Journal(copy, run="exp") as journal:
        journal.record(31, b"after")  # folds in the event it missed, then its own
        assert stored_text(journal) == logs_text(journal)
        assert "appended by another library" in stored_text(journal)


def test_a_journal_of_the_previous_release_gets_its_rows_at_its_first_writable_open(tmp_path):
    target = tmp_path / "journal-0.1.0"
    target.mkdir(mode=0o700)
    shutil.copy2(DATA / "journal-0.1.0" / "data.mdb", target / "data.mdb")
    with Journal(str(target), readonly=True) as journal:
        assert journal.stored_audit_rows() is None
        old = logs_text(journal)
    with Journal(str(target), session=False) as journal:
        assert stored_text(journal) == logs_text(journal) == old


def test_a_log_with_an_event_that_cannot_be_decoded_keeps_no_rows_until_reindex_after_the_repair(copy):
    with Journal(copy, session=False) as journal:
        append_raw(journal, [b"\xc1 not msgpack"])
        damaged = journal.last_seq()
    with Journal(copy, session=False) as journal:  # its open folds in the event the rows lack: damaged
        assert journal.stored_audit_rows() is None
        with pytest.raises(EventDecodeError):
            logs_text(journal)  # the verb, reading the log, raises what it raised before the rows existed
    assert items(copy, "rows") == []
    put_raw(copy, "events", seq_key(damaged), packed({**call, "run": "exp", "step": 40, "reason": "repaired"}))
    with Journal(copy, session=False) as journal:
        assert journal.stored_audit_rows() is None
        journal.reindex()
        assert stored_text(journal) == logs_text(journal)


@pytest.mark.parametrize("change", ["changed", "missing", "extra"])
def test_a_stored_row_that_is_not_the_logs_is_named_by_verify_and_mended_by_reindex(copy, change):
    rows = items(copy, "rows")
    key, text = rows[3]
    if change == "changed":
        put_raw(copy, "rows", key, text.replace(b'"reason":"', b'"reason":"not ', 1))
    elif change == "missing":
        delete_raw(copy, "rows", key)
    else:  # a row at the seq of an event that has none (a session's opening)
        key = next(k for k, _ in items(copy, "events") if k not in dict(rows))
        put_raw(copy, "rows", key, text)
    with Journal(copy) as journal:
        problems = [p for p in journal.verify() if p.kind == "rows"]
        assert [p.where for p in problems] == [str(int.from_bytes(key, "big"))]
        assert "stepjournal reindex" in problems[0].detail
        assert stored_text(journal) != logs_text(journal)  # the verb prints what is stored: hence verify
        journal.reindex()
        assert [p for p in journal.verify() if p.kind == "rows"] == []
        assert stored_text(journal) == logs_text(journal)


@pytest.mark.parametrize("written", [b"2.2", b"1.1", b"1"])
def test_rows_of_another_format_are_not_read_and_a_writable_open_rewrites_them(copy, written):
    put_raw(copy, "meta", META_ROWS_INDEX, written + b" 999999")
    with Journal(copy, readonly=True) as journal:
        assert journal.stored_audit_rows() is None
    with Journal(copy, session=False) as journal:
        assert stored_text(journal) == logs_text(journal)


def test_a_meta_key_without_its_rows_database_is_refused_not_read_as_empty(tmp_path):
    target = tmp_path / "journal-0.1.0"
    target.mkdir(mode=0o700)
    shutil.copy2(DATA / "journal-0.1.0" / "data.mdb", target / "data.mdb")
    with Journal(str(target), readonly=True) as journal:
        last = journal.last_seq()
    put_raw(str(target), "meta", META_ROWS_INDEX, b"%s %d" % (ROWS_FORMAT, last))
    with Journal(str(target), readonly=True) as journal:
        with pytest.raises(IntegrityError, match="no `rows` database"):
            list(journal.stored_audit_rows())


def test_a_pull_by_a_library_without_the_rows_is_folded_in_by_the_next_append_with_its_provenance(tmp_path,
                                                                                                    monkeypatch):
    """The catch-up runs inside an append's transaction (whose values are views) and reads the markers of
    the pulls before the rows' end: a pulled replay names its record by the seq it has here."""
    import stepjournal.index._rows_index as rows_index  # private: the rows projection's format
    from stepjournal.sharing import pull, push

    remote, source, target = (tmp_path / "remote").resolve().as_uri(), str(tmp_path / "src"), str(tmp_path / "t")
    with Journal(source, run="other", sync=False) as other:
        other.record(1, b"o")
    push(source, remote)
    pull(remote, target)  # this library: the rows hold the pulled record
    with Journal(target, run="here", sync=False) as journal:
        with Journal(source, run="other", sync=False) as other:
            other.record_replay(2, other.lookup(1), reason="2 -> 1")
        push(source, remote)
        with monkeypatch.context() as patched:
            patched.setattr(rows_index, "apply_in", lambda *args, **kwargs: None)  # a library without the rows
            pull(remote, target)
        assert journal.stored_audit_rows() is None
        journal.record(1, b"mine")  # folds in the pulled replay, then its own row
        printed = stored_text(journal)
        assert printed == logs_text(journal)
    replay = next(row for row in json.loads(printed) if row["action"] == "replayed")
    assert replay["origin_journal"] and replay["source_seq"] is not None


@pytest.mark.parametrize("planted", [
    b'"reason":"\x1b[2J',  # a raw control character (not JSON)
    b'"reason":"\x7f',  # DEL, which JSON leaves raw
    b'"reason":"\xc2\x9b',  # C1 CSI
    b'"reason":"\xe2\x80\xae',  # a bidi override
], ids=["ESC", "DEL", "C1", "bidi"])
def test_a_stored_row_with_a_character_a_terminal_acts_on_is_refused_by_every_reader(copy, planted):
    key, text = items(copy, "rows")[0]
    put_raw(copy, "rows", key, text.replace(b'"reason":"', planted, 1))
    with Journal(copy, readonly=True, check="as-read") as journal:
        for laid_out in (True, False):
            with pytest.raises(IntegrityError, match=rf"audit row #{int.from_bytes(key, 'big')} is not a row"):
                list(journal.stored_audit_rows(laid_out=laid_out))


@pytest.mark.parametrize("stored", [b'{"a":1},{"b":2}', b"[1,2]", b"not json", b"{}"])
def test_a_stored_value_that_is_not_one_row_object_is_refused(copy, stored):
    key, _text = items(copy, "rows")[2]
    put_raw(copy, "rows", key, stored)
    with Journal(copy, readonly=True) as journal:
        with pytest.raises(IntegrityError, match="not a row this library writes"):
            list(journal.stored_audit_rows(laid_out=True))


def test_reindex_mends_a_changed_row_keeps_the_others_and_deletes_rows_no_event_gives(copy):
    rows = items(copy, "rows")
    with Journal(copy, readonly=True) as journal:
        last = journal.last_seq()
    first_key, first_text = rows[0]
    put_raw(copy, "rows", first_key, first_text.replace(b'"reason":"', b'"reason":"not ', 1))
    for stray in (seq_key(last + 5), seq_key(last + 9)):  # past the log's end: the last rows of the table
        put_raw(copy, "rows", stray, rows[1][1])
    with Journal(copy, session=False) as journal:
        # the strays too: the next append reaching their seqs would be refused
        assert [p.where for p in journal.verify() if p.kind == "rows"] == [
            str(s) for s in (int.from_bytes(first_key, "big"), last + 5, last + 9)]
        journal.reindex()
        assert stored_text(journal) == logs_text(journal)
    assert items(copy, "rows") == rows  # the changed row rewritten, the strays gone, the rest as they were


def test_a_limit_reads_the_first_rows_across_batches_as_the_log_gives_them(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path, run="many", sync=False) as journal:
        for step in range(1, 2101):  # more rows than one batch of the reader (2048)
            journal.record_bypass(step, reason=f"call {step}")
    with Journal(path, readonly=True) as journal:
        rows = json.loads(logs_text(journal))
        for limit in (0, 1, 2048, 2049, 2100, 5000):
            out = io.StringIO()
            with redirect_stdout(out):
                _print_laid_out(journal.stored_audit_rows(laid_out=True, limit=limit))
            assert json.loads(out.getvalue()) == rows[:limit], limit
            assert [json.loads(t) for t in journal.stored_audit_rows(limit=limit)] == rows[:limit]


def test_reindex_mends_rows_across_its_batches_wherever_they_differ(tmp_path):
    path = str(tmp_path / "j")
    for session, steps in enumerate((range(1, 1501), range(1501, 3001), range(3001, 4601))):
        with Journal(path, run=f"run{session % 2}", sync=False) as journal:  # each opening: an event with no row
            for step in steps:
                journal.record_bypass(step, reason=f"call {step}")
    rows, events = items(path, "rows"), items(path, "events")
    keys = dict(rows)
    rowless = [key for key, _ in events if key not in keys]
    assert len(rows) == 4600 and len(rowless) == 3  # the reindex compares 2048 rows at a time: three batches
    delete_raw(path, "rows", rows[10][0])  # in the first batch
    for at in (2047, 2048, 2500, 4599):  # a batch's last row, the next one's first, inside, the log's last
        put_raw(path, "rows", rows[at][0], rows[at][1].replace(b'"reason":"', b'"reason":"not ', 1))
    for stray in (*rowless, seq_key(int.from_bytes(events[-1][0], "big") + 1)):  # before the first row, between
        put_raw(path, "rows", stray, rows[0][1])  # batches, past the log's end
    with Journal(path, session=False) as journal:
        assert len([p for p in journal.verify() if p.kind == "rows"]) == 1 + 4 + 4
        journal.reindex()
        assert [p for p in journal.verify() if p.kind == "rows"] == []
        assert stored_text(journal) == logs_text(journal)
    assert items(path, "rows") == rows


def test_rows_stored_before_not_stored_existed_are_rebuilt_not_called_damage(copy):
    """Rows a library before `not_stored` stored (format 1.2, no such key) do not hold the log for this one:
    `verify` finds the journal whole instead of every generate call's row differing, and a writable open
    rewrites them."""
    rows = [(key, bytes(value)) for key, value in items(copy, "rows")]
    old = [(key, re.sub(rb',"not_stored":null|"not_stored":null,', b"", value)) for key, value in rows]
    assert old != rows  # the fixture has rows that hold the key
    for key, value in old:
        put_raw(copy, "rows", key, value)
    with Journal(copy, readonly=True) as journal:
        last = journal.last_seq()
    put_raw(copy, "meta", META_ROWS_INDEX, b"1.2 %d" % last)
    with Journal(copy, readonly=True) as journal:
        assert journal.stored_audit_rows() is None
        assert journal.verify() == []
    with Journal(copy, session=False) as journal:
        assert stored_text(journal) == logs_text(journal)
