"""Many processes open one new journal at once: an open waits for the creation under way (as LMDB does).

A new journal's ``data.mdb`` is created empty inside `lmdb.open`, which then writes its first pages.
The ranks an `accelerate` or `torchrun` launch starts open one journal at the same moment, so one of them
can see that empty file before LMDB's own lock; it must wait for the creation, and only a
``data.mdb`` that is empty with no creation under way is refused as damaged.
"""

from __future__ import annotations

import os

import pytest

from stepjournal import Journal
from stepjournal.errors import IntegrityError
from journal_workers import open_new_journals
from cli_support import run_cli as cli
from kill_points import start_script
from reliability_support import worker_context

# The creator stops where its open is about to call lmdb.open for a new journal (`check_room_to_create`
# measures the disk first): the point where LMDB would create data.mdb empty and then fill it.
CREATOR = """
import os, sys
from kill_points import Lockstep
from stepjournal import Journal

lockstep, stopped = Lockstep.inherited(), []

def before_creation(frame, event, arg):
    if event == "c_call" and arg is os.statvfs and not stopped:
        stopped.append(True)
        sys.setprofile(None)
        lockstep.point("creating")

sys.setprofile(before_creation)
with Journal(sys.argv[1], run="creator") as journal:
    journal.record(0, {"rank": 0})
"""

# The second process tells where it waits for a lock (Python's audit event, before the call) and how its
# open ended.
SECOND = """
import sys
from kill_points import Lockstep
from stepjournal import Journal
from stepjournal.errors import StepJournalError

lockstep, said = Lockstep.inherited(), []

def waits(event, args):
    if event == "fcntl.flock" and not said:
        said.append(True)
        lockstep.point("waits for the lock")

sys.addaudithook(waits)
readonly = sys.argv[2] == "reader"
try:
    with Journal(sys.argv[1], run="second", readonly=readonly) as journal:
        if not readonly:
            journal.record(0, {"rank": 1})
except StepJournalError as exc:
    lockstep.point(f"refused: {type(exc).__name__}: {exc}")
else:
    lockstep.point("opened")
"""


@pytest.mark.parametrize("second", ["writer", "reader"])
def test_an_open_while_another_process_creates_the_journal_waits_for_it(tmp_path, second):
    path = str(tmp_path / "journal")
    data = os.path.join(path, "data.mdb")
    creator = start_script(CREATOR, path)
    assert creator.next_point() == "creating"
    assert not os.path.exists(data)
    # What lmdb.open does first: data.mdb made, empty; its first pages are written next.
    os.close(os.open(data, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    other = start_script(SECOND, path, second)
    try:
        said = other.next_point()
        assert said == "waits for the lock", f"the second {second} did not wait for the creation: {said}"
        other.go()
    finally:
        creator.go()  # on from "creating": LMDB fills data.mdb, then the creator records
        creator.finish()
    assert other.finish()[-1] == "opened"
    with Journal(path, readonly=True) as journal:
        assert journal.verify() == []
        assert journal.recorded_steps(run="creator") == [0]
        assert journal.recorded_steps(run="second") == ([0] if second == "writer" else [])


def test_eight_processes_open_one_new_journal_at_once_every_round(tmp_path):
    ranks, rounds = 8, 100
    failures = open_new_journals(worker_context(), str(tmp_path), ranks, rounds)
    assert failures == []
    for n in range(rounds):
        with Journal(os.path.join(tmp_path, f"round-{n}"), readonly=True) as journal:
            assert sorted(journal.recorded_steps(run=f"rank-{r}") for r in range(ranks)) == [[n]] * ranks
            assert journal.verify() == []


@pytest.mark.parametrize("readonly", [False, True])
def test_an_empty_data_file_that_no_process_creates_is_refused_at_once(tmp_path, readonly):
    path = tmp_path / "journal"
    path.mkdir(mode=0o700)
    (path / "data.mdb").touch(mode=0o600)
    with pytest.raises(IntegrityError, match="data.mdb is empty"):
        Journal(str(path), readonly=readonly)
    assert os.path.getsize(path / "data.mdb") == 0


@pytest.mark.parametrize("data", [b"", b"\0" * 100])
def test_compact_of_a_creation_that_was_killed_says_so_in_one_line_and_writes_nothing(tmp_path, data):
    # What a creator killed inside lmdb.open leaves: LMDB made lock.mdb, then data.mdb, and wrote none or
    # part of its first page. compact opened it with lmdb.open and died with a traceback.
    path = tmp_path / "journal"
    path.mkdir(mode=0o700)
    (path / "lock.mdb").touch(mode=0o600)
    (path / "data.mdb").write_bytes(data)
    for to in ([], ["--to", str(tmp_path / "copy")]):
        done = cli("compact", str(path), *to)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert "data.mdb is empty" in lines[0] if not data else "not an LMDB file" in lines[0], lines[0]
    assert (path / "data.mdb").read_bytes() == data and not (tmp_path / "copy").exists()
