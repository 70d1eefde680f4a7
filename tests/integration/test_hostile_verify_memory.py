"""`verify` in bounded memory: an event of nested empty arrays, and a journal bigger than the RSS.

Each check runs `verify` in a fresh `spawn` child and reads its peak RSS (`ru_maxrss`) before and
after. An event of 30 MiB of nested empty arrays (one byte each on disk, one Python list each once
unpacked) made verify's salvage of its step peak at 2.5 GiB; verifying a 1.9 GB journal of 10 000
steps kept every mapped page (2.1 GB RSS), as `load` does not.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import resource
import struct

import msgpack
import numpy as np
import torch

from stepjournal import Journal

import lmdb


def _verify_child(path: str, out: str) -> None:
    journal = Journal(path, readonly=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    problems = [(p.kind, p.steps, p.detail[:80]) for p in journal.verify()]
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    journal.close()
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"problems": problems, "growth": growth}, fh)


def verify_in_child(path: str, tmp_path) -> dict:
    out = str(tmp_path / "verify.json")
    proc = mp.get_context("spawn").Process(target=_verify_child, args=(path, out))
    proc.start()
    proc.join(600)
    assert proc.exitcode == 0, f"the child died ({proc.exitcode})"
    with open(out, encoding="utf-8") as fh:
        return json.load(fh)


def test_an_event_of_30_mib_of_nested_empty_arrays_costs_verify_no_memory_and_names_its_step(tmp_path):
    path = str(tmp_path / "journal")
    with Journal(path, run="salvage") as journal:
        journal.record(1, {"x": 1})
        seq = journal.last_seq() + 1
    n = 30 << 20
    junk = b"\xdd" + struct.pack(">I", n) + b"\x90" * n  # an array of 30 Mi empty arrays
    body = b"\x83" + msgpack.packb("type") + msgpack.packb("generation_recorded") + msgpack.packb("junk") + junk
    body += msgpack.packb("step") + msgpack.packb(5)
    env = lmdb.open(path, max_dbs=8, subdir=True, map_size=1 << 30)  # lmdb_raw's map is too small for it
    try:
        with env.begin(write=True, db=env.open_db(b"events")) as txn:
            txn.put(seq.to_bytes(8, "big"), body)
    finally:
        env.close()
    result = verify_in_child(path, tmp_path)
    assert [[kind, steps] for kind, steps, _ in result["problems"]] == [["event", [5]]]
    assert result["growth"] < 100 << 20, f"verify's peak RSS grew by {result['growth'] >> 20} MiB"


def test_verifying_a_300_mb_journal_keeps_peak_rss_well_under_its_size(tmp_path):
    path = str(tmp_path / "journal")
    rng = np.random.default_rng(0)
    with Journal(path, run="big", sync=False) as journal:
        for step in range(1500):  # 200 KB each: below the size `load` releases value by value
            journal.record(step, {"noise": torch.from_numpy(rng.integers(0, 255, 200_000, dtype=np.uint8))})
    size = sum(f.stat().st_size for f in (tmp_path / "journal").iterdir())
    assert size > 300_000_000
    result = verify_in_child(path, tmp_path)
    assert result["problems"] == []
    assert result["growth"] < size // 4, f"verify's peak RSS grew by {result['growth'] >> 20} MiB for {size >> 20} MiB"
