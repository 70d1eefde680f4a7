"""The folders a payload file is renamed into are durable before its event commits, even when another
process made them and was killed (or is still running) before it synced them: the first payload file of
each handle syncs the journal folder (for ``payloads/``) and ``payloads/`` (for its 257 folders) once,
whoever made them, because a SIGKILL keeps an unsynced entry in the page cache, where a power cut loses it."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch

from kill_points import start_script
from stepjournal import Journal
from stepjournal.payloads._file_store import PAYLOAD_FOLDER  # private: the folder layout under test
from stepjournal.payloads._payload_store import FILE_FROM  # private: the file threshold

BIG = FILE_FROM // 8 + 4096  # int64: just over FILE_FROM encoded

FIRST_RECORD = """
    import os, sys, torch
    from kill_points import Lockstep
    from stepjournal import Journal

    path, n = sys.argv[1], int(sys.argv[2])
    lockstep = Lockstep.inherited()
    points = lockstep.filesystem(path)
    with Journal(path) as journal:
        points(True)
        journal.record(1, {"ids": torch.arange(n) + 1, "step": 1})
        points(False)
        lockstep.point("acknowledged 1")
"""


def big(step: int) -> dict:
    return {"ids": torch.arange(BIG) + step, "step": step}


def _fsyncs(monkeypatch: pytest.MonkeyPatch) -> list:
    """What `os.fsync` is called on from now on in this process: ``"file"`` or the folder's name."""
    calls: list = []
    real = os.fsync

    def fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        calls.append(os.path.basename(target) if os.path.isdir(target) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


@pytest.mark.parametrize("stop", ["os.fsync .", "os.fsync payloads"])
def test_a_record_after_a_writer_killed_before_it_synced_the_folders_syncs_them_before_its_event(
        tmp_path, monkeypatch, stop):
    """SIGKILL before the fsync of the journal folder (the entry ``payloads``) or of ``payloads/`` (its
    folders): the entries the child made are in the page cache only. The next record, in another process,
    must make them durable before its event commits, or a power cut after its acknowledgement loses the file."""
    path = tmp_path / "j"
    child = start_script(textwrap.dedent(FIRST_RECORD), str(path), str(BIG))
    seen = child.run_to(lambda label: label == stop)
    assert "acknowledged 1" not in seen and os.path.isdir(path / PAYLOAD_FOLDER)
    with Journal(path) as journal:
        calls = _fsyncs(monkeypatch)
        digest = journal.record(1, big(1)).event.output.digest
        assert "j" in calls and PAYLOAD_FOLDER in calls
        assert calls.index(PAYLOAD_FOLDER) < calls.index(digest[:2])  # before the file's name is made durable
        calls.clear()
        digest = journal.record(2, big(2)).event.output.digest
        assert calls == ["file", digest[:2]]  # once a handle: later records flush their file and folder only


def test_a_second_process_recording_while_the_first_makes_the_folders_keeps_both_records(tmp_path, monkeypatch):
    """The first writer stopped halfway through the 256 mkdirs (observed: before ``payloads/80``); a second
    process records a large step meanwhile (it makes the rest and syncs them), then the first goes on. Both
    records are acknowledged, read back and verify clean, and each process synced the folders."""
    path = tmp_path / "j"
    child = start_script(textwrap.dedent(FIRST_RECORD), str(path), str(BIG))
    while child.next_point() != "os.mkdir payloads/80":
        child.go()
    with Journal(path) as journal:
        calls = _fsyncs(monkeypatch)
        journal.record(2, big(2))
        assert PAYLOAD_FOLDER in calls and "j" in calls
    child.go()
    seen = child.finish()
    assert "acknowledged 1" in seen and "os.fsync payloads" in seen
    with Journal(path, readonly=True) as journal:
        assert journal.recorded_steps() == [1, 2] and journal.verify() == []
        assert torch.equal(journal.load_output(journal.lookup(2))["ids"], big(2)["ids"])
        assert torch.equal(journal.load_output(journal.lookup(1))["ids"], torch.arange(BIG) + 1)
    assert sorted(os.listdir(path / PAYLOAD_FOLDER)) == sorted(["tmp", *(f"{n:02x}" for n in range(256))])
