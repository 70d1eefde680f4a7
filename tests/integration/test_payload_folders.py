"""A journal's ``payloads/`` folder gets its ``tmp/`` and all 256 two-digit folders at its first payload file,
made durable by one fsync, so that a large record flushes only its file and that file's folder; a writer
killed while it makes them loses nothing and leaves nothing verify complains of after compact."""

from __future__ import annotations

import os
import textwrap

import pytest
import torch

from kill_points import start_script
from stepjournal import Journal
from stepjournal.upkeep import compact
from stepjournal.payloads._file_store import PAYLOAD_FOLDER, TMP_FOLDER  # private: the folder layout under test
from stepjournal.payloads._payload_store import FILE_FROM  # private: the file threshold

BIG = FILE_FROM // 8 + 4096  # int64: just over FILE_FROM encoded
FANS = sorted(f"{n:02x}" for n in range(256))


def big(step: int) -> dict:
    return {"ids": torch.arange(BIG) + step, "step": step}


def folders(path) -> list:
    return sorted(os.listdir(os.path.join(path, PAYLOAD_FOLDER)))


class _Fsyncs:
    """What `os.fsync` was called on in this process (each call still made): ``"file"`` or the folder's name."""

    def __init__(self, patch: pytest.MonkeyPatch) -> None:
        self.calls: list = []
        real = os.fsync

        def fsync(fd: int) -> None:
            self.calls.append(_name_of(fd))
            real(fd)

        patch.setattr(os, "fsync", fsync)


def _name_of(fd: int) -> str:
    target = os.readlink(f"/proc/self/fd/{fd}")
    return os.path.basename(target) if os.path.isdir(target) else "file"


def test_the_first_payload_file_makes_every_two_digit_folder_and_one_fsync_makes_them_durable(tmp_path, monkeypatch):
    path = tmp_path / "j"
    with Journal(path) as journal:
        fsyncs = _Fsyncs(monkeypatch)
        digest = journal.record(1, big(1)).event.output.digest
    assert folders(path) == sorted([TMP_FOLDER, *FANS])
    # The journal's folder (for payloads/), payloads/ once (for its 257 folders), the file, the file's folder.
    assert sorted(fsyncs.calls) == sorted(["j", PAYLOAD_FOLDER, "file", digest[:2]])


def test_a_large_record_in_a_journal_that_has_its_folders_flushes_its_file_and_its_folder_only(tmp_path, monkeypatch):
    path = tmp_path / "j"
    with Journal(path) as journal:
        journal.record(1, big(1))
    with Journal(path) as journal:  # a new handle: it finds the folders there and makes none
        fsyncs = _Fsyncs(monkeypatch)
        digest = journal.record(2, big(2)).event.output.digest
        # Its first file syncs payloads/ and the journal folder once, whoever made them (a killed writer may
        # not have: test_payload_folders_durable.py).
        assert fsyncs.calls == [PAYLOAD_FOLDER, "j", "file", digest[:2]]
        fsyncs.calls.clear()
        digest = journal.record(3, big(3)).event.output.digest
        assert fsyncs.calls == ["file", digest[:2]]


def test_a_two_digit_folder_removed_by_hand_is_made_again_durably_by_the_record_that_needs_it(tmp_path, monkeypatch):
    path = tmp_path / "j"
    with Journal(path) as journal:
        taken = journal.record(0, big(0)).event.output.digest[:2]
        value = next(big(step) for step in range(1, 64) if journal.prepare(big(step)).digest[:2] != taken)
        fan = journal.prepare(value).digest[:2]
    os.rmdir(os.path.join(path, PAYLOAD_FOLDER, fan))  # an empty folder: its payload is not recorded yet
    with Journal(path) as journal:
        fsyncs = _Fsyncs(monkeypatch)
        journal.record(1, value)
        assert journal.verify() == []
    assert PAYLOAD_FOLDER in fsyncs.calls and fsyncs.calls[-1] == fan and folders(path) == sorted([TMP_FOLDER, *FANS])


FIRST_RECORD = """
    import os, sys, torch
    from kill_points import Lockstep
    from stepjournal import Journal

    path, n = sys.argv[1], int(sys.argv[2])
    lockstep = Lockstep.inherited()
    points = lockstep.filesystem(os.path.join(path, "payloads"))
    with Journal(path) as journal:
        points(True)
        journal.record(1, {"ids": torch.arange(n) + 1, "step": 1})
        points(False)
        lockstep.point("acknowledged 1")
"""


@pytest.mark.parametrize("stop, release", [("os.mkdir 00", False), ("os.mkdir 80", False), ("os.mkdir ff", True),
                                           ("os.fsync .", False), ("os.fsync .", True)])
def test_a_first_record_killed_while_its_folders_are_made_leaves_a_journal_that_verifies_and_records(
        tmp_path, stop, release):
    """SIGKILL at an observed step of the folders' making (before a mkdir, before or on the way from the
    one fsync of ``payloads/``): nothing was acknowledged, no event names a payload, verify finds at most
    the staged file a kill cut short (compact removes it), and the step then records and replays."""
    path = tmp_path / "j"
    child = start_script(textwrap.dedent(FIRST_RECORD), str(path), str(BIG))
    seen = child.run_to(lambda label: label == stop, release=release)
    assert "acknowledged 1" not in seen
    with Journal(path, readonly=True) as journal:
        assert journal.recorded_steps() == []
        assert {p.kind for p in journal.verify()} <= {"partial_file"}
    compact(path)
    with Journal(path) as journal:
        assert journal.verify() == []
        journal.record(1, big(1))
        replayed = journal.load_output(journal.lookup(1))
        assert torch.equal(replayed["ids"], big(1)["ids"]) and journal.verify() == []
    assert folders(path) == sorted([TMP_FOLDER, *FANS])
