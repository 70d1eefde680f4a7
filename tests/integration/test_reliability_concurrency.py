"""Concurrency: spawned processes, threads and async callers record into one journal at once.

Each process records its own run from several threads (distinct steps) and from async callers that
share one engine (one step, many generation indices), starting from a 64 KiB map so the map grows
while the others write. A reader process audits all the while and checks that every snapshot holds
only whole transactions. Afterwards: sequence numbers are gapless, every expected call is recorded
exactly once, nothing else is, and every payload verifies and holds the bytes that were recorded.
"""

from __future__ import annotations

import os
from collections import Counter

import pytest
import torch

from stepjournal import Journal
from stepjournal.events import GenerationRecorded, SessionOpened

from reliability_support import report, worker_context
from reliability_workers import concurrent_payload, concurrent_writer, snapshot_reader

ASYNC_BASE = 1_000_000


def run_concurrently(tmp_path, procs: int, threads: int, per_thread: int, async_steps: int, fanout: int) -> dict:
    path = str(tmp_path / "journal")
    Journal(path, run="parent").close()
    ctx = worker_context()
    stop, reader_out = str(tmp_path / "stop"), str(tmp_path / "reader.txt")
    reader = ctx.Process(target=snapshot_reader, args=(path, stop, reader_out))
    reader.start()
    done = [str(tmp_path / f"done{i}") for i in range(procs)]
    writers = [
        ctx.Process(target=concurrent_writer, args=(path, i, threads, per_thread, async_steps, fanout, done[i]))
        for i in range(procs)
    ]
    for w in writers:
        w.start()
    for w in writers:
        w.join(900)
    open(stop, "w").close()
    reader.join(300)
    assert [w.exitcode for w in writers] == [0] * procs
    for d in done:
        with open(d, encoding="utf-8") as fh:
            assert fh.read() == "ok"
    assert reader.exitcode == 0
    with open(reader_out, encoding="utf-8") as fh:
        seen = fh.read()
    snapshots, max_events, loaded = (int(x) for x in seen.split())  # a violation is text, not 3 numbers
    assert snapshots >= 3

    expected = set()
    for i in range(procs):
        expected |= {(f"proc{i}", 1 + t + k * threads, 0) for t in range(threads) for k in range(per_thread)}
        expected |= {(f"proc{i}", ASYNC_BASE + s, g) for s in range(async_steps) for g in range(fanout)}
    with Journal(path, readonly=True) as journal:
        seqs = [seq for seq, _ in journal.raw_events()]
        assert seqs == list(range(1, len(seqs) + 1)), "sequence numbers have a gap"
        events = list(journal.events())
        calls = Counter((e.run, e.step, e.gen_index) for _, e in events if isinstance(e, GenerationRecorded))
        assert set(calls) == expected, "a call was lost, or one appeared that nobody made"
        assert max(calls.values()) == 1, "a call was recorded twice"
        assert sum(isinstance(e, SessionOpened) for _, e in events) == procs  # the parent's journaled no call
        for run, step, gen_index in expected:
            value = journal.load_output(journal.lookup(step, gen_index, run=run))
            proc = int(run[4:])
            if step < ASYNC_BASE:
                want = concurrent_payload(proc, step, 0)
                assert value["proc"] == proc and torch.equal(value["v"], want["v"])
            else:
                assert value["step"] == step and torch.equal(value["t"], torch.zeros(16))
        assert journal.verify() == []
        events_total = journal.last_seq()
    return {
        "processes": procs,
        "threads_per_process": threads,
        "async_callers_per_step": fanout,
        "records": len(expected),
        "events": events_total,
        "reader_snapshots_checked": snapshots,
        "reader_payloads_loaded": loaded,
        "lost": 0,
        "duplicated": 0,
    }


def test_processes_threads_and_async_callers_record_at_once_without_loss(tmp_path):
    figures = run_concurrently(tmp_path, procs=3, threads=3, per_thread=30, async_steps=3, fanout=8)
    report("concurrency", **figures)


@pytest.mark.soak
def test_processes_threads_and_async_callers_record_at_once_without_loss_soak(tmp_path):
    figures = run_concurrently(tmp_path, procs=6, threads=4, per_thread=1500, async_steps=40, fanout=16)
    report("concurrency_soak", **figures)


def test_threads_sharing_one_engine_get_distinct_generation_indices(jpath):
    """Threads calling one journaled function for the same step: indices 0..n-1, each once."""
    import threading

    from stepjournal.adapters import journaled

    with Journal(jpath, run="shared") as journal:
        rollout = journaled(lambda step: {"step": step, "tid": threading.get_ident()}, journal, "dump",
                            input_of=None)
        barrier = threading.Barrier(8)

        def body():
            barrier.wait()
            for step in range(1, 11):
                rollout(step=step)

        workers = [threading.Thread(target=body) for _ in range(8)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        for step in range(1, 11):
            assert journal.recorded_indices(step) == list(range(8))
        assert journal.verify() == []


def test_opening_a_journal_another_process_grew_meanwhile_adopts_the_new_map_size(tmp_path):
    """The open's structure check began a read transaction with the map size this process asked for;
    when another process had grown the map since (a big record), LMDB said MDB_MAP_RESIZED and the
    opening process died. The check now adopts the new size, as every other transaction does."""
    import subprocess
    import sys

    import lmdb

    from stepjournal.storage._lmdb_check import check_env_structure  # private: the LMDB file checks under test

    path = str(tmp_path / "journal")
    Journal(path, map_size=64 * 1024).close()
    env = lmdb.open(path, map_size=64 * 1024, max_dbs=16, subdir=True)  # this process's open, small map
    grow = ("import sys, torch\nfrom stepjournal import Journal\n"
            "with Journal(sys.argv[1], map_size=64 << 20) as j:\n"
            "    j.record(1, {'x': torch.arange(200_000)})\n")
    done = subprocess.run([sys.executable, "-c", grow, path], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    with pytest.raises(lmdb.MapResizedError):  # what LMDB says to a process still at the old size
        env.begin().abort()
    check_env_structure(env, os.path.join(path, "data.mdb"), path)  # adopts the new size, then checks
    with env.begin() as txn:
        assert txn.id() > 0
    env.close()
