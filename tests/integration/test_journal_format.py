"""A journal of a newer on-disk format than this library's is never written, and read only when it says so.

The newer journals are made with raw LMDB (a newer stepjournal does not exist yet): the ``meta``
keys that library would write, ``format`` raised and ``written_by`` naming it.
"""

from __future__ import annotations

import pytest

from stepjournal import Journal, __version__
from stepjournal.base import JOURNAL_FORMAT
from stepjournal.errors import IntegrityError, JournalFormatError
from cli_support import run_cli as cli
from lmdb_raw import delete_raw, drop_db, items, put_raw, tables

NEWER = JOURNAL_FORMAT + 1


@pytest.fixture
def newer(tmp_path):
    """A journal with one record, then marked as written in the next format by stepjournal 9.1.0."""
    path = str(tmp_path / "journal")
    with Journal(path) as journal:
        journal.record(1, {"ids": [1, 2]})
    put_raw(path, "meta", b"format", str(NEWER).encode())
    put_raw(path, "meta", b"written_by", b"9.1.0")
    return path


def _one_error_line(done, *words: str) -> str:
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    for word in words:
        assert word in lines[0], lines[0]
    assert "pip install" not in lines[0]
    return lines[0]


def test_a_writable_open_of_a_newer_format_is_refused_naming_the_version_that_wrote_it(newer):
    before = items(newer, "meta")
    with pytest.raises(JournalFormatError, match=rf"in format {NEWER}, written by stepjournal 9\.1\.0") as caught:
        Journal(newer)
    assert (caught.value.format, caught.value.written_by) == (NEWER, "9.1.0")
    assert "clone or wheel" in str(caught.value) and "pip install" not in str(caught.value)
    assert items(newer, "meta") == before  # nothing written, not even this version's name
    with pytest.raises(JournalFormatError, match="9.1.0"):
        Journal(newer, session=False)


def test_a_writing_verb_refuses_a_newer_format_in_one_line(newer):
    _one_error_line(cli("prune", "--keep-last", "1", newer), f"format {NEWER}", "stepjournal 9.1.0")
    _one_error_line(cli("reindex", newer), f"format {NEWER}", "stepjournal 9.1.0")


def test_reading_verbs_refuse_a_newer_format_that_does_not_say_it_is_readable(newer):
    with pytest.raises(JournalFormatError, match="would misread it"):
        Journal(newer, readonly=True)
    for verb in ("runs", "audit"):
        _one_error_line(cli(verb, newer), f"format {NEWER}", "stepjournal 9.1.0")


def test_a_newer_format_readable_by_this_one_is_read_with_one_warning_naming_the_version(newer):
    put_raw(newer, "meta", b"read_format", str(JOURNAL_FORMAT).encode())
    with Journal(newer, readonly=True) as journal:
        assert journal.recorded_steps() == [1]
    with pytest.raises(JournalFormatError, match="or open it read-only to read it"):
        Journal(newer)
    done = cli("runs", newer)
    assert done.returncode == 0 and "default" in done.stdout, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "journal_format_newer" in line and "9.1.0" in line and "Traceback" not in done.stderr


def test_a_writable_open_records_this_format_and_the_version_that_wrote_it(tmp_path):
    path = str(tmp_path / "journal")
    Journal(path).close()
    meta = dict(items(path, "meta"))
    assert meta[b"format"] == str(JOURNAL_FORMAT).encode() and meta[b"written_by"] == __version__.encode()
    put_raw(path, "meta", b"written_by", b"0.0.1")  # an older stepjournal wrote it since
    Journal(path, session=False).close()
    assert dict(items(path, "meta"))[b"written_by"] == __version__.encode()


def test_compact_refuses_a_newer_format_and_leaves_it_as_it_was(newer):
    before = items(newer, "meta")
    _one_error_line(cli("compact", newer), f"format {NEWER}", "stepjournal 9.1.0")
    assert items(newer, "meta") == before


@pytest.mark.parametrize("value", [b"-1", b"0", b"+1", b" 1", b"1_0", b"1" + b"0" * 30])
def test_a_format_no_stepjournal_writes_is_refused_and_the_journal_left_as_it_was(tmp_path, value):
    # Formats are the decimal numbers this library writes, from 1: "0" or "-1" is damage, not an older
    # format to write over; a format of 31 digits is garbage rather than a newer one.
    path = str(tmp_path / "journal")
    with Journal(path) as journal:
        journal.record(1, {"ids": [1, 2]})
    put_raw(path, "meta", b"format", value)
    before = items(path, "meta")
    for readonly in (False, True):
        with pytest.raises(IntegrityError, match="meta key 'format' holds"):
            Journal(path, readonly=readonly, session=False)
    assert items(path, "meta") == before
    _one_error_line(cli("prune", "--keep-last", "1", path), "meta key 'format' holds")
    assert items(path, "meta") == before


def test_a_journal_with_events_and_no_format_is_not_taken_for_a_new_one(tmp_path):
    # A missing format made the open stamp it as new: its creation time replaced, this format and the
    # current key layout written over a journal whose format and index nobody knows.
    path = str(tmp_path / "journal")
    with Journal(path) as journal:
        journal.record(1, {"ids": [1, 2]})
    delete_raw(path, "meta", b"format")
    before = items(path, "meta")
    with pytest.raises(IntegrityError, match="holds events but no format"):
        Journal(path, session=False)
    assert items(path, "meta") == before
    _one_error_line(cli("reindex", path), "holds events but no format")
    assert items(path, "meta") == before


def test_a_writable_open_of_a_newer_format_creates_none_of_the_tables_that_format_lacks(newer):
    # The open made every named database it knows before the format was read: a newer format without
    # one (here: rows) was written to, then refused.
    drop_db(newer, "rows")
    before = tables(newer)
    with pytest.raises(JournalFormatError, match=f"in format {NEWER}"):
        Journal(newer, session=False)
    assert tables(newer) == before
