"""A journal folder received from someone else may hold a link, a FIFO or a file at any path the journal owns
(``payloads/``, ``payloads/tmp/``, the two-digit folders, the payload files, ``remotes.json`` and its temporary
file, the writer locks): no verb follows the link, waits on the FIFO or writes into a file with other names;
each ends in a result or one error line, and nothing outside the journal changes. A journal folder whose name is
not UTF-8 opens like any other.

A verb that could hang runs in a process of its own, its timeout a bound on a hang only: the assertion is its
error line. tests/integration/test_hostile_folder_shapes.py runs every shape at every owned path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import CompactError, UnsafePathError
from stepjournal.sharing import add_remote, list_remotes
from stepjournal.upkeep import compact
from stepjournal.base._paths import writer_lock_name  # private: the lock file's name
from stepjournal.payloads._file_store import PAYLOAD_FOLDER, TMP_FOLDER  # private: the file store's layout
from stepjournal.payloads._payload_store import FILE_FROM  # private: the store's internals

from cli_support import run_cli
from folder_shapes import snapshot

BIG = FILE_FROM // 8 + 4096  # int64: just over FILE_FROM encoded, so the payload is a file
HANG = 120  # seconds: a bound on a hung verb, not a measure


@pytest.fixture
def journal(tmp_path) -> str:
    """A journal of run ``r``: step 1's payload a file, step 2's in LMDB."""
    path = str(tmp_path / "journal")
    with Journal(path, run="r") as recording:
        recording.record(1, {"ids": torch.arange(BIG)})
        recording.record(2, {"ids": torch.arange(4)})
    return path


def payload_file(path: str) -> str:
    root = os.path.join(path, PAYLOAD_FOLDER)
    # All 256 two-digit folders are made with the first file: the one file is in one of them.
    (fan,) = [name for name in os.listdir(root) if name != TMP_FOLDER and os.listdir(os.path.join(root, name))]
    (name,) = os.listdir(os.path.join(root, fan))
    return os.path.join(root, fan, name)


def elsewhere(tmp_path) -> str:
    """A folder of the user's outside the journal, holding names a journal's tidying would remove."""
    folder = tmp_path / "elsewhere"
    (folder / "ab").mkdir(parents=True)
    for name in ("precious.txt", "left-by-a-crash", "ab/" + "c" * 62):
        (folder / name).write_bytes(b"the user's own " + name.encode())
    return str(folder)


def one_error_line(done: subprocess.CompletedProcess, *says: str) -> None:
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("stepjournal: error: ") and all(s in done.stderr for s in says), done.stderr


@pytest.mark.parametrize("linked", ["payloads/tmp", "payloads", "payloads/FAN"])
def test_compact_through_a_link_in_the_payload_folder_removes_nothing_where_it_points(journal, tmp_path, linked):
    """``payloads/tmp``, ``payloads`` or a two-digit folder linked to a folder of the user's: compact (which
    removes half-written files and files no event names) refuses, naming the link; that folder is untouched."""
    outside = elsewhere(tmp_path)
    target = os.path.join(journal, linked.replace("FAN", os.path.basename(os.path.dirname(payload_file(journal)))))
    shutil.rmtree(target)
    os.symlink(outside, target)
    before = snapshot(outside)
    with pytest.raises(UnsafePathError, match=f"{os.path.basename(target)}' is a symbolic link to"):
        compact(journal)
    one_error_line(run_cli("compact", journal, timeout=HANG), "is a symbolic link")
    assert snapshot(outside) == before


def test_compact_through_a_link_at_lock_mdb_leaves_the_file_it_points_to_as_it_was(journal, tmp_path):
    """compact empties ``lock.mdb`` after its swap: a link there to a file of the user's is refused first."""
    mine = tmp_path / "mine.txt"
    mine.write_bytes(b"the user's own notes")
    os.unlink(os.path.join(journal, "lock.mdb"))
    os.symlink(mine, os.path.join(journal, "lock.mdb"))
    with pytest.raises(UnsafePathError, match="lock.mdb in journal folder .* is a symbolic link"):
        compact(journal)
    assert mine.read_bytes() == b"the user's own notes"


def test_remote_add_through_a_link_at_its_temporary_file_overwrites_nothing(journal, tmp_path):
    """A link at the name the config's temporary file once had (``.remotes.json.<pid>.tmp``) to a file of the
    user's: ``remote add`` writes its config all the same, and the user's file keeps its bytes."""
    mine = tmp_path / "mine.txt"
    mine.write_bytes(b"the user's own notes")
    os.symlink(mine, os.path.join(journal, f".remotes.json.{os.getpid()}.tmp"))
    add_remote(journal, "origin", "file:///somewhere/remote")
    assert mine.read_bytes() == b"the user's own notes"
    assert not os.path.islink(os.path.join(journal, "remotes.json"))
    assert [r.name for r in list_remotes(journal)] == ["origin"]


def test_a_fifo_at_a_payload_file_is_reported_by_verify_and_refused_by_compact_to_and_a_read_without_hanging(
        journal, tmp_path):
    """``compact --to`` (which copies the payload files) used to wait on the FIFO for ever; verify called the
    payload missing."""
    path = payload_file(journal)
    os.unlink(path)
    os.mkfifo(path)
    one_error_line(run_cli("compact", journal, "--to", str(tmp_path / "copy"), timeout=HANG), "is a FIFO")
    done = run_cli("verify", journal, timeout=HANG)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "unsafe_path" in done.stdout, done
    read = textwrap.dedent("""
        import sys
        from stepjournal import Journal
        from stepjournal.errors import StepJournalError
        with Journal(sys.argv[1], run="r", readonly=True) as journal:
            try:
                journal.load_output(journal.lookup(1))
            except StepJournalError as exc:
                print(type(exc).__name__, exc)
    """)
    child = subprocess.run([sys.executable, "-c", read, journal], capture_output=True, text=True, timeout=HANG)
    assert child.stdout.startswith("UnsafePathError ") and "is a FIFO" in child.stdout, child
    assert child.stdout.count("\n") == 1 and child.returncode == 0, child


def test_a_fifo_at_remotes_json_is_refused_with_one_line_without_hanging(journal):
    os.mkfifo(os.path.join(journal, "remotes.json"))
    for verb in (["remote", "list", journal], ["remote", "add", journal, "origin", "file:///somewhere/remote"]):
        one_error_line(run_cli(*verb, timeout=HANG), "remotes.json' is a FIFO")


RECORD = textwrap.dedent("""
    import sys, torch
    from stepjournal import Journal
    from stepjournal.errors import StepJournalError
    try:
        with Journal(sys.argv[1], run="r") as journal:
            journal.record(3, {"ids": torch.arange(4)})
        print("recorded")
    except StepJournalError as exc:
        print(type(exc).__name__, exc)
""")


@pytest.mark.parametrize("shape", ["fifo", "hard link"])
def test_a_fifo_or_a_hard_link_at_the_writer_lock_is_refused_and_the_other_file_keeps_its_bytes(journal, tmp_path, shape):
    """The writer lock is written in place: a FIFO there, or a hard link to a file of the user's, is refused
    by the record with one line (it used to be skipped, or truncated and overwritten)."""
    lock = os.path.join(journal, writer_lock_name("r"))
    os.unlink(lock)
    mine = tmp_path / "mine.txt"
    mine.write_bytes(b"the user's own notes")
    os.mkfifo(lock) if shape == "fifo" else os.link(mine, lock)
    child = subprocess.run([sys.executable, "-c", RECORD, journal], capture_output=True, text=True, timeout=HANG)
    says = "is a FIFO" if shape == "fifo" else "is a file with 2 hard links"
    assert child.stdout.startswith("UnsafePathError ") and says in child.stdout, child
    assert child.stdout.count("\n") == 1 and child.returncode == 0, child
    assert mine.read_bytes() == b"the user's own notes"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a folder to another user")
def test_a_folder_of_another_user_in_the_payload_folder_is_refused(journal):
    os.chown(os.path.join(journal, PAYLOAD_FOLDER, TMP_FOLDER), 4321, 4321)
    with pytest.raises(UnsafePathError, match="tmp' is owned by user id 4321"):
        compact(journal)


@pytest.mark.parametrize("shape", ["file", "link"])
def test_a_payload_folder_that_is_a_file_or_a_link_is_a_problem_verify_reports(journal, tmp_path, shape):
    root = os.path.join(journal, PAYLOAD_FOLDER)
    shutil.rmtree(root)
    if shape == "file":
        with open(root, "wb") as f:
            f.write(b"not a folder")
    else:
        os.symlink(elsewhere(tmp_path), root)
    with Journal(journal, run="r", readonly=True) as reader:
        problems = reader.verify()
    assert [(p.kind, p.where) for p in problems] == [("unsafe_path", root)]
    assert ("is a file," if shape == "file" else "is a symbolic link to") in problems[0].detail
    done = run_cli("verify", journal, timeout=HANG)
    assert done.returncode == 1 and "Traceback" not in done.stderr and "unsafe_path" in done.stdout, done


def test_a_journal_folder_whose_name_is_not_utf8_records_reads_verifies_and_compacts(tmp_path):
    path = os.path.join(str(tmp_path), os.fsdecode(b"j\xff\xfe"))
    with Journal(path, run="r") as journal:
        journal.record(1, {"ids": torch.arange(BIG)})
        journal.record(2, {"ids": torch.arange(4)})
        add_remote(journal, "origin", "file:///somewhere/remote")
    compact(path)
    with Journal(path, run="r", readonly=True) as journal:
        assert torch.equal(journal.load_output(journal.lookup(1))["ids"], torch.arange(BIG))
        assert torch.equal(journal.load_output(journal.lookup(2))["ids"], torch.arange(4))
        assert journal.verify() == []
    assert [r.name for r in list_remotes(path)] == ["origin"]
    done = run_cli("verify", path, timeout=HANG)
    assert done.returncode == 0 and "journal is whole" in done.stdout, done


RECORD_WATCHED = textwrap.dedent("""
    import sys, torch
    from kill_points import Lockstep
    from stepjournal import Journal
    path, n = sys.argv[1], int(sys.argv[2])
    switch = Lockstep.inherited().filesystem(path)
    with Journal(path, run="r") as recording:
        switch(True)
        recording.record(3, {"ids": torch.arange(n) + 1})
""")


def test_a_staged_file_swapped_for_a_hard_link_after_its_creation_is_not_written_through(journal, tmp_path):
    """A staged payload file is created exclusively under a random name, then written: when another process
    puts a hard link to a file of the user's at that name in between (the child stopped at its first step after
    the creation), the bytes still go to the file the journal created; the user's file keeps its bytes."""
    import re

    from kill_points import start_script

    mine = tmp_path / "mine.txt"
    mine.write_bytes(b"the user's own notes")
    child = start_script(RECORD_WATCHED, journal, str(BIG))
    staged = None
    while True:
        label = child.next_point()
        assert label is not None, f"the record ended before its staged file was made: {child.seen[-5:]}"
        if staged is not None:
            break  # the file exists now: its creation's step came before
        if re.fullmatch(r"open payloads/tmp/[0-9a-f]{32}", label):
            staged = os.path.join(journal, label.split(" ", 1)[1])
        child.go()
    os.unlink(staged)
    os.link(mine, staged)
    child.go()
    child.finish(exits=(0, 1))
    assert mine.read_bytes() == b"the user's own notes"


def test_compact_to_a_link_to_nowhere_is_refused_in_one_line_and_creates_nothing_where_it_points(journal, tmp_path):
    """``compact --to`` a link to nowhere: not a new folder (it is a name taken), refused as a target that exists."""
    os.symlink(tmp_path / "nowhere", tmp_path / "copy")
    with pytest.raises(CompactError, match="exists and is not an empty folder"):
        compact(journal, to=tmp_path / "copy")
    one_error_line(run_cli("compact", journal, "--to", str(tmp_path / "copy"), timeout=HANG), "not an empty folder")
    assert not os.path.lexists(tmp_path / "nowhere")


def test_a_link_at_compacts_own_work_folder_name_is_removed_and_what_it_points_to_is_untouched(journal, tmp_path):
    """A received journal may hold a link at ``.compact-<pid>``, the work folder's name for the process that
    compacts (a container's compaction runs at the same few process ids): compact removes the link, as it
    removes what a killed compaction left, and compacts; the folder it pointed to is untouched."""
    outside = elsewhere(tmp_path)
    before = snapshot(outside)
    os.symlink(outside, os.path.join(journal, f".compact-{os.getpid()}"))
    compact(journal)
    assert not any(name.startswith(".compact-") for name in os.listdir(journal))
    assert snapshot(outside) == before
