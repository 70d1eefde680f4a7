"""Something other than a folder of ours at a payload folder's name (a link, a dangling link, a FIFO, a plain
file): the large record that needs it is refused with `UnsafePathError` naming the path and what to do, the
journal keeps every acknowledged record, verify names the path, and the refused record leaves no file behind."""

from __future__ import annotations

import os

import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import UnsafePathError
from stepjournal.payloads._file_store import PAYLOAD_FOLDER, TMP_FOLDER  # private: the folder layout under test
from stepjournal.payloads._payload_store import FILE_FROM  # private: the file threshold

BIG = FILE_FROM // 8 + 4096  # int64: just over FILE_FROM encoded


def big(step: int) -> dict:
    return {"ids": torch.arange(BIG) + step, "step": step}


def _plant(at: str, shape: str, elsewhere: str) -> None:
    if shape == "link":
        os.symlink(elsewhere, at)
    elif shape == "dangling":
        os.symlink(os.path.join(elsewhere, "nothing-here"), at)
    elif shape == "fifo":
        os.mkfifo(at)
    else:
        with open(at, "w") as f:
            f.write("not a folder")


@pytest.mark.parametrize("shape", ["link", "dangling", "fifo", "file"])
@pytest.mark.parametrize("where", [PAYLOAD_FOLDER, TMP_FOLDER, "fan"])
def test_a_record_refused_for_a_bad_payload_folder_keeps_the_journal_and_leaves_no_file(tmp_path, where, shape):
    path = tmp_path / "j"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with Journal(path) as journal:
        journal.record(0, {"a": 0})
        fan = journal.prepare(big(1)).digest[:2]
    if where != PAYLOAD_FOLDER:
        os.mkdir(path / PAYLOAD_FOLDER)
    at = str(path / PAYLOAD_FOLDER / (fan if where == "fan" else where)) if where != PAYLOAD_FOLDER else str(
        path / PAYLOAD_FOLDER)
    _plant(at, shape, str(elsewhere))
    with Journal(path) as journal:
        with pytest.raises(UnsafePathError, match="Move it away") as refused:
            journal.record(1, big(1))
        assert repr(at) in str(refused.value)
        if where != TMP_FOLDER and where != PAYLOAD_FOLDER:
            # Before: the file staged in tmp/ for the refused record stayed there (until a collection, or forever).
            assert os.listdir(path / PAYLOAD_FOLDER / TMP_FOLDER) == []
        assert journal.recorded_steps() == [0] and journal.load_output(journal.lookup(0)) == {"a": 0}
        assert [p.kind for p in journal.verify()] == ["unsafe_path"]
    assert os.listdir(elsewhere) == []  # nothing written where a link points
