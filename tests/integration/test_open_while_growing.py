"""Opening a journal while another process grows its map.

LMDB reads the map's size as an environment opens; py-lmdb then begins a transaction inside
`lmdb.open`, which LMDB refuses (`MDB_MAP_RESIZED`) when another process committed past that size in
between. That window cannot be hit on purpose from Python, so these tests let a real second process
grow the journal at the first open and then report what LMDB reports there; the open must go on with
the grown map, and give up in words only when the resizing never settles.
"""

from __future__ import annotations

import os

import lmdb
import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import JournalError
from reliability_support import worker_context

RESIZED = "mdb_txn_begin: MDB_MAP_RESIZED: Database contents grew beyond environment mapsize"  # LMDB's words


def _child_grows(path: str) -> None:
    with Journal(path, run="grower", map_size=64 * 1024) as journal:
        journal.record(1, {"x": torch.arange(300_000, dtype=torch.int64)})  # 2.4 MB: the map grows


def _grown_by_a_second_process(path: str) -> None:
    child = worker_context().Process(target=_child_grows, args=(path,))
    child.start()
    child.join(120)
    assert child.exitcode == 0


def test_an_open_that_another_process_resizes_opens_again_with_the_grown_map(tmp_path, monkeypatch):
    path = str(tmp_path / "journal")
    Journal(path, run="first", map_size=64 * 1024).close()
    small = os.path.getsize(os.path.join(path, "data.mdb"))
    real_open, opens = lmdb.open, []

    def open_racing_a_growth(*args, **kwargs):
        opens.append(kwargs["map_size"])
        if len(opens) == 1:
            _grown_by_a_second_process(path)
            raise lmdb.MapResizedError(RESIZED)
        return real_open(*args, **kwargs)

    monkeypatch.setattr(lmdb, "open", open_racing_a_growth)
    with Journal(path, run="first", map_size=64 * 1024) as journal:
        assert len(opens) == 2
        assert journal.recorded_steps(run="grower") == [1]
        assert torch.equal(journal.load_output(journal.lookup(1, run="grower"))["x"], torch.arange(300_000))
        journal.record(1, {"y": torch.ones(300_000)})
    # the child's record: past the map the first open read
    assert os.path.getsize(os.path.join(path, "data.mdb")) > small + 2_400_000
    with Journal(path, readonly=True) as journal:
        assert journal.recorded_steps(run="first") == [1] and journal.recorded_steps(run="grower") == [1]


def test_an_open_resized_without_end_gives_up_naming_the_journal(tmp_path, monkeypatch):
    path = str(tmp_path / "journal")
    Journal(path, run="first").close()

    def always_resized(*args, **kwargs):
        raise lmdb.MapResizedError(RESIZED)

    monkeypatch.setattr(lmdb, "open", always_resized)
    with pytest.raises(JournalError, match=r"journal '.*journal' was resized by another process 8 times"):
        Journal(path, run="first")
