"""Fork and spawn: a journal opened before fork() is reopened in the child, never reused unsafely.

fork() is what dataloader workers and many process pools do; Ray and spawn-based pools pickle what
they send, and a `Journal` refuses to be pickled with a message that says to pass its path instead.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import sys
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from stepjournal import Journal
from stepjournal.errors import JournalError
from stepjournal.events import GenerationRecorded

from reliability_support import report

FORK = mp.get_context("fork")


class _RecordingDataset(Dataset):
    """A dataset whose workers look up and record through a journal the parent opened."""

    def __init__(self, journal: Journal, n: int) -> None:
        self.journal = journal
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        step = 100 + i
        self.journal.record(step, {"item": i, "x": torch.full((64,), i)})
        found = self.journal.lookup(step)
        return torch.tensor([i, found.seq, os.getpid()])


def test_dataloader_fork_workers_reopen_the_parents_journal_and_the_parent_goes_on(tmp_path):
    path = str(tmp_path / "journal")
    with Journal(path, run="loader") as journal:
        journal.record(1, {"x": torch.zeros(8)})
        # timeout: a worker that cannot hand its batch back fails the test instead of hanging it
        loader = DataLoader(_RecordingDataset(journal, 12), batch_size=3, num_workers=2,
                            multiprocessing_context="fork", timeout=60)
        rows = torch.cat(list(loader))
        assert sorted(rows[:, 0].tolist()) == list(range(12))
        worker_pids = set(rows[:, 2].tolist())
        assert os.getpid() not in worker_pids and len(worker_pids) == 2
        journal.record(2, {"x": torch.ones(8)})
        assert journal.recorded_steps() == [1, 2] + list(range(100, 112))
        sessions = journal.sessions()
        assert {ev.pid for _, ev in sessions} == {os.getpid(), *worker_pids}
        assert journal.verify() == []
    report("fork_dataloader", workers=2, records_from_workers=12)


def test_iterating_events_across_a_fork_keeps_the_parents_view_whole(tmp_path):
    """A paused `events()` iteration holds no transaction a fork child could end under the parent."""
    path = str(tmp_path / "journal")
    with Journal(path, run="iter") as journal:
        for step in range(1, 3001):
            journal.record(step, {"s": step, "pad": "x" * 200}, store_output=step % 2 == 0)
        events = journal.events()
        first = [next(events) for _ in range(10)]

        def child() -> None:
            journal.record(5000, {"from": "child"})
            os._exit(0 if journal.lookup(5000) is not None else 3)

        proc = FORK.Process(target=child)
        proc.start()
        proc.join(60)
        assert proc.exitcode == 0
        for step in range(3001, 3400):  # the parent writes on: freed pages get reused
            journal.record(step, {"s": step, "pad": "y" * 300})
        rest = list(events)
        seqs = [seq for seq, _ in first + rest]
        assert seqs == list(range(1, len(seqs) + 1))
        assert len(seqs) >= 3002
        recorded = [e.step for _, e in first + rest if isinstance(e, GenerationRecorded)]
        assert recorded[:3000] == list(range(1, 3001))
        assert journal.verify() == []


def _record_big_forever(journal: Journal, stop: threading.Event, counts: list) -> None:
    step = 0
    while not stop.is_set():
        step += 1
        journal.record(step, {"x": torch.full((2_000_000,), step, dtype=torch.int64)})
        counts[0] = step


def test_fork_while_another_thread_writes_neither_hangs_the_child_nor_harms_the_parent(tmp_path):
    """fork() waits for the other threads' transactions; the child reopens and records."""
    path = str(tmp_path / "journal")
    forks = 12
    with Journal(path, run="threads") as journal:
        stop, counts = threading.Event(), [0]
        writer = threading.Thread(target=_record_big_forever, args=(journal, stop, counts))
        writer.start()
        try:
            while counts[0] < 2:
                time.sleep(0.01)
            for k in range(forks):

                def child(k=k) -> None:
                    journal.record(10_000 + k, {"k": k})
                    os._exit(0 if journal.lookup(10_000 + k) is not None else 3)

                proc = FORK.Process(target=child)
                proc.start()
                proc.join(60)
                if proc.exitcode is None:
                    proc.kill()
                assert proc.exitcode == 0, f"fork {k}: child exit code {proc.exitcode}"
                time.sleep(0.03)
        finally:
            stop.set()
            writer.join()
        steps = journal.recorded_steps()
        assert steps[: counts[0]] == list(range(1, counts[0] + 1))
        assert steps[-forks:] == [10_000 + k for k in range(forks)]
        assert journal.verify() == []
    report("fork_threads", forks_during_writes=forks, parent_records=counts[0])


def test_fork_child_of_a_read_only_journal_reopens_read_only(tmp_path):
    path = str(tmp_path / "journal")
    with Journal(path) as journal:
        journal.record(1, {"a": 1})
    reader = Journal(path, readonly=True)

    def child() -> None:
        ok = reader.recorded_steps() == [1] and reader.load_output(reader.lookup(1)) == {"a": 1}
        try:
            reader.record(2, {"a": 2})
            ok = False
        except JournalError:
            pass
        os._exit(0 if ok else 3)

    proc = FORK.Process(target=child)
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert reader.recorded_steps() == [1]
    reader.close()


def test_a_journal_refuses_to_be_pickled_and_says_to_send_its_path(jpath):
    """What spawn pools, spawn dataloader workers and Ray do to arguments: pickle them."""
    with Journal(jpath) as journal:
        with pytest.raises(JournalError, match="pass the journal's path"):
            pickle.dumps(journal)


def _open_by_path(path: str) -> None:
    with Journal(path, run="spawned") as journal:
        journal.record(1, {"from": "spawned child"})


def test_spawned_child_opens_the_journal_by_path(jpath):
    with Journal(jpath) as journal:
        proc = mp.get_context("spawn").Process(target=_open_by_path, args=(jpath,))
        proc.start()
        proc.join(120)
        assert proc.exitcode == 0
        assert journal.recorded_steps(run="spawned") == [1]


def test_passing_an_open_journal_to_a_spawned_child_fails_clearly_in_the_parent(jpath):
    with Journal(jpath) as journal:
        proc = mp.get_context("spawn").Process(target=_open_by_path, args=(journal,))
        with pytest.raises(JournalError, match="pass the journal's path"):
            proc.start()


FORK_AFTER_A_LARGE_DIGEST = """
import os, sys
from stepjournal import Journal
with Journal(sys.argv[1], run="r") as journal:
    journal.record(1, {"x": b"1" * (8 << 20)})  # 8 MiB: hashed on BLAKE3's threads, which a fork child lacks
pid = os.fork()
if pid == 0:  # (bytes, not a tensor: torch's own thread pool has the same trouble after a fork)
    with Journal(sys.argv[2], run="r") as journal:
        journal.record(1, {"x": b"0" * (8 << 20)})
        os._exit(0 if journal.lookup(1) is not None else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def test_a_fork_child_records_a_large_payload_after_the_parent_hashed_one(tmp_path):
    """A DataLoader-style fork child records a payload file once the parent has hashed one on BLAKE3's threads."""
    import signal
    import subprocess

    proc = subprocess.Popen([sys.executable, "-c", FORK_AFTER_A_LARGE_DIGEST, str(tmp_path / "a"), str(tmp_path / "b")],
                            start_new_session=True)
    try:
        assert proc.wait(timeout=120) == 0  # a hang detector only: before the fix the child never ended
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
