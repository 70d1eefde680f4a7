"""Run keys at LMDB's key limit: refused up front with a clear message, never a raw MDB_BAD_VALSIZE.

An index key is the run key and mode in UTF-8, two NULs and 12 bytes of step and index; LMDB keys
hold at most 511 bytes. A 500-character run key once passed a 512-character check and then failed
inside `record()` with LMDB's generic error.
"""

from __future__ import annotations

import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import InvalidKeyError
from stepjournal.events._keys import MAX_KEY_BYTES  # private: the key layout itself

# The bytes a run key may take with the default mode "train" and stage "generate": 511 - 12 - 3 - 5 - 8.
LARGEST = MAX_KEY_BYTES - 12 - 3 - len("train") - len("generate")


@pytest.mark.parametrize("run", ["r" * 500, "\U0001F600" * 200], ids=["500-ascii", "200-emoji"])
def test_a_run_key_too_long_in_bytes_is_refused_when_the_journal_opens(tmp_path, run):
    with pytest.raises(InvalidKeyError, match=rf"take {len(run.encode()) + 5} bytes encoded as UTF-8.*at most 488.*"
                                              r"use a shorter run key"):
        Journal(str(tmp_path / "j"), run=run)


def test_a_mode_that_pushes_the_largest_run_key_over_is_refused_by_record_and_records_nothing(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path, run="r" * LARGEST) as journal:
        with pytest.raises(InvalidKeyError, match=r"run key and mode take 493 bytes.*at most 488"):
            journal.record(1, {"x": 1}, mode="evaluation")
        assert journal.recorded_steps(mode="evaluation") == []
        assert journal.verify() == []


@pytest.mark.parametrize("run", ["r" * LARGEST, "\U0001F600" * (LARGEST // 4) + "r" * (LARGEST % 4)],
                         ids=["ascii", "emoji"])
def test_the_largest_allowed_run_key_records_and_replays_after_a_reopen(tmp_path, run):
    assert len(run.encode()) == LARGEST
    path = str(tmp_path / "j")
    with Journal(path, run=run) as journal:
        journal.record(3, {"ids": torch.arange(4)})
    with Journal(path, run=run, readonly=True) as journal:
        assert journal.recorded_steps() == [3]
        assert torch.equal(journal.load_output(journal.lookup(3))["ids"], torch.arange(4))
        assert journal.verify() == []
    with pytest.raises(InvalidKeyError):
        Journal(path, run=run + "r")


def test_a_stage_too_long_for_any_run_key_is_named_with_the_room_it_has(tmp_path):
    stage = "reward." + "x" * 5000
    with Journal(str(tmp_path / "j")) as journal:
        with pytest.raises(InvalidKeyError, match=rf"stage 'reward\.x+' takes 5007 bytes encoded as UTF-8; it may "
                                                  rf"take at most {MAX_KEY_BYTES - 12 - 3 - 2}.*use a shorter stage"):
            journal.record(1, {"x": 1}, stage=stage)
        assert journal.last_seq() == 0
