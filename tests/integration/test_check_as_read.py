"""A read-only journal checked as read (`Journal(..., check="as-read")`, what `runs` and `audit` use).

The structure check of data.mdb (journal/storage/_lmdb_check.py) then costs what a read touches, not the
file's size: the small trees at open, the event log range by range as it is read. No page may reach
LMDB unchecked, and a damaged page is refused in the same words as the check at open, by whichever
read first reaches it; a damaged page that a verb does not read does not stop it.
"""

from __future__ import annotations

import json
import os
import re

import pytest

from stepjournal import Journal
from stepjournal.errors import IntegrityError
from stepjournal.storage._lmdb_check import check_data_file  # private: the LMDB file checks under test

import lmdb_pages as pages
from test_hostile_files import _cli, journal  # noqa: F401 - `journal`: a fresh copy of this module's template

STEPS = 3000  # hundreds of leaves of events, under branch pages


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("as_read") / "journal")
    with Journal(path, run="r", fingerprint={"model": "m"}, sync=False) as journal:
        for step in range(STEPS):
            journal.record(step, {"ids": [step, step + 1]}, input={"prompt": step})
    with Journal(path, run="r", sync=False) as journal:  # a second session, near the end of the log
        journal.record(STEPS, {"ids": [0]})
    return path


def _data(path: str) -> str:
    return os.path.join(path, "data.mdb")


def _events_leaf(path: str, where: str) -> int:
    """The page number of the first, middle or last leaf of the events tree."""
    data = pages.read(_data(path))
    events = pages.named_dbs(data)["events"]
    assert events.depth >= 2
    level = [events.root]
    for _ in range(events.depth - 1):
        level = [pages.child(data, node) for pgno in level for node in pages.nodes(data, pgno)]
    assert len(level) > 20
    return level[{"first": 0, "middle": len(level) // 2, "last": len(level) - 1}[where]]


def _damage(path: str, leaf: int) -> str:
    """Make `leaf` claim to be another page; return the words the check at open refuses it with."""
    psize = pages.page_size(pages.read(_data(path)))
    pages.patch(_data(path), leaf * psize, "<Q", leaf + 1)
    with pytest.raises(IntegrityError) as refused:
        check_data_file(_data(path), journal=path)
    assert f"page {leaf} of database 'events' is not a tree page" in str(refused.value)
    return str(refused.value)


def test_a_damaged_events_page_runs_does_not_read_does_not_stop_runs_while_audit_and_verify_refuse_it(journal):
    before = _cli("runs", "--json", journal)
    assert before.returncode == 0, before.stderr
    words = _damage(journal, _events_leaf(journal, "middle"))
    after = _cli("runs", "--json", journal)
    assert after.returncode == 0 and after.stdout == before.stdout, after.stderr
    assert json.loads(after.stdout)[0]["calls"] == STEPS + 1
    for command in (["audit", "--json"], ["audit", "--no-pager"], ["verify"]):
        done = _cli(*command, journal)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert words in done.stderr.replace("\n", " ") or words in done.stderr, (command, done.stderr)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_reading_the_whole_log_checked_as_read_refuses_a_damaged_page_in_the_words_of_the_check_at_open(journal, where):
    words = _damage(journal, _events_leaf(journal, where))
    with pytest.raises(IntegrityError, match=re.escape(words)):
        Journal(journal, readonly=True)
    with Journal(journal, readonly=True, check="as-read") as opened:
        with pytest.raises(IntegrityError) as refused:
            for _ in opened.raw_events():
                pass
        assert str(refused.value) == words


def test_an_intact_journal_reads_the_same_checked_as_read(journal):
    with Journal(journal, readonly=True) as whole:
        expected = (list(whole.raw_events()), whole.last_seq(), whole.run_summaries(), whole.event(1))
    with Journal(journal, readonly=True, check="as-read") as lazy:
        got = (list(lazy.raw_events()), lazy.last_seq(), lazy.run_summaries(), lazy.event(1))
        assert list(lazy.raw_events(since=STEPS - 5)) == expected[0][STEPS - 5:]
    assert got == expected and got[1] == STEPS + 3


def test_opening_checked_at_open_while_open_checked_as_read_checks_the_rest(journal):
    words = _damage(journal, _events_leaf(journal, "middle"))
    with Journal(journal, readonly=True, check="as-read") as lazy:
        assert lazy.run_summaries()[0].calls == STEPS + 1
        with pytest.raises(IntegrityError, match=re.escape(words)):
            Journal(journal, readonly=True)


def test_checking_as_read_is_for_read_only_journals(tmp_path):
    with pytest.raises(ValueError, match="as-read"):
        Journal(str(tmp_path / "j"), check="as-read")
    with pytest.raises(ValueError, match="'soon'"):
        Journal(str(tmp_path / "j"), readonly=True, check="soon")
