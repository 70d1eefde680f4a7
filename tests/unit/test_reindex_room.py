"""`reindex` makes room for what it writes before it starts.

The projections it drops free their pages only for later transactions, so a rebuild writes them anew.
A journal whose map is full (a compacted copy, or a map that just holds what is committed, which is how
a process opens a journal another one grew) made the rebuild fill the map midway: the map grew and the
whole rebuild ran again (23 s instead of 11 at 10⁶ events).
"""

from __future__ import annotations

import os

import lmdb

from stepjournal import Journal
from stepjournal.index._projections import Projections  # private: the projections' internals


def test_reindex_of_a_journal_whose_map_is_full_rebuilds_once(tmp_path, monkeypatch):
    path, full = str(tmp_path / "j"), str(tmp_path / "compacted")
    with Journal(path, run="r", sync=False) as journal:
        for step in range(1, 3001):
            journal.record_bypass(step, reason=f"call {step}")
        expected = journal.audit()
    os.makedirs(full)
    env = lmdb.open(path, max_dbs=8, readonly=True, lock=False)
    env.copy(full, compact=True)  # no free pages: the rebuild's pages come from the map's end
    env.close()
    runs = []
    rebuild_in = Projections.rebuild_in.__func__

    def counted(cls, txn, store, **kwargs):
        runs.append(1)
        return rebuild_in(cls, txn, store, **kwargs)

    monkeypatch.setattr(Projections, "rebuild_in", classmethod(counted))
    with Journal(full, session=False) as journal:
        env = journal._store._env().env
        env.set_mapsize(1)  # LMDB keeps what is committed: the map ends where the data does
        assert env.info()["map_size"] == (env.info()["last_pgno"] + 1) * env.stat()["psize"]
        assert journal.reindex() == 3001
        assert runs == [1]
        assert journal.audit() == expected
        assert journal.verify() == []
