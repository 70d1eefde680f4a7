"""Growth and full disks: the map grows by itself; a full disk or size cap fails in a typed way.

A journal opened with a 64 KiB map grows through a GB (several GB under ``make soak``) without an
error reaching the caller. When the disk is really full (a small tmpfs mounted for the test, or a
file-size limit where mounting is not allowed) or the configured `max_size` is reached, recording
raises `JournalFullError`, every record already made stays whole, the journal reopens and verifies,
and the loop goes on without recording as docs/reliability.md shows.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import JournalFullError
from stepjournal.payloads._payload_store import FILE_FROM  # private: the store's internals

from log_capture import captured_events
from reliability_support import report, worker_context
from reliability_workers import fill_disk

MB = 1 << 20


def grow(path: str, total_bytes: int, payload_bytes: int) -> dict:
    """Record unique payloads into a journal that starts with a 64 KiB map, until `total_bytes`. The
    payloads stay under `FILE_FROM`, so every byte of them goes through LMDB's map."""
    assert payload_bytes + 4096 < FILE_FROM
    started = time.monotonic()
    n = payload_bytes // 8
    with captured_events() as logs:
        with Journal(path, run="grow", map_size=64 * 1024) as journal:
            for step in range(1, 41):  # small records first: many growths from the tiny start
                journal.record(step, {"s": step, "x": torch.full((step * 512,), step, dtype=torch.int64)})
            step, written = 40, 0
            while written < total_bytes:
                step += 1
                journal.record(step, {"s": step, "x": torch.full((n,), step, dtype=torch.int64)})
                written += payload_bytes
            last = step
            map_size = journal._store._env().env.info()["map_size"]
    growths = [e for e in logs if e["event"] == "journal_map_grown"]
    with Journal(path, run="grow", readonly=True) as journal:
        assert journal.recorded_steps() == list(range(1, last + 1))
        for s in (1, 40, 41, last // 2, last):
            size = s * 512 if s <= 40 else n
            assert torch.equal(journal.load_output(journal.lookup(s))["x"], torch.full((size,), s, dtype=torch.int64))
        assert journal.verify() == []
    file_bytes = os.path.getsize(os.path.join(path, "data.mdb"))
    shutil.rmtree(path)
    return {
        "gb_recorded": round(written / 1e9, 3),
        "data_file_gb": round(file_bytes / 1e9, 3),
        "records": last,
        "map_growths": len(growths),
        "start_map_bytes": 64 * 1024,
        "final_map_bytes": map_size,
        "seconds": round(time.monotonic() - started, 1),
    }


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_a_journal_grows_from_64_kib_through_a_gb_without_an_error(tmp_path):
    assert _free_bytes(str(tmp_path)) > 3 * (1 << 30), "needs 3 GB free in the temp folder"
    figures = grow(str(tmp_path / "journal"), 1 << 30, FILE_FROM - 64 * 1024)
    assert figures["map_growths"] >= 10 and figures["final_map_bytes"] >= 1 << 30
    report("growth", **figures)


@pytest.mark.soak
def test_a_journal_grows_from_64_kib_through_several_gb_without_an_error(tmp_path):
    assert _free_bytes(str(tmp_path)) > 12 * (1 << 30), "needs 12 GB free in the temp folder"
    figures = grow(str(tmp_path / "journal"), 5 << 30, FILE_FROM - 64 * 1024)
    report("growth_soak", **figures)


# -- full ------------------------------------------------------------------------------------------------
def _mount_tmpfs(where: str, size_mb: int) -> bool:
    os.makedirs(where, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m,mode=700", "tmpfs", where],
                              capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _run_fill(path: str, out: str, fsize_limit: int = 0) -> dict:
    proc = worker_context().Process(target=fill_disk, args=(path, out, fsize_limit))
    proc.start()
    proc.join(300)
    assert proc.exitcode == 0
    with open(out, encoding="utf-8") as fh:
        return json.load(fh)


def _check_full(result: dict, what: str) -> None:
    assert result["error"] is not None and what in result["error"] and "nothing already recorded" in result["error"]
    assert result["recorded"] > 3 and result["contiguous"] and result["intact"]
    assert result["verify_open"] == [] and result["verify_reopened"] == []
    assert result["recorded_reopened"] == result["recorded"] and result["unrecorded_calls"] == 5


def test_a_really_full_disk_raises_journal_full_error_and_harms_nothing(tmp_path):
    """A 48 MB tmpfs when this process may mount one (root); else a 48 MB file-size limit (EFBIG)."""
    disk = str(tmp_path / "disk")
    mounted = _mount_tmpfs(disk, 48)
    try:
        path = os.path.join(disk, "journal")
        ballast = os.path.join(disk, "ballast")
        if mounted:
            with open(ballast, "wb") as fh:
                fh.write(b"\0" * (4 * MB))
        result = _run_fill(path, str(tmp_path / "out.json"), 0 if mounted else 48 * MB)
        _check_full(result, "full")
        if mounted:
            os.unlink(ballast)  # space is free again: recording goes on in the same journal
            with Journal(path, run="full") as journal:
                journal.record(result["recorded"] + 1, {"x": torch.zeros(1000)})
                assert journal.verify() == []
                assert len(journal.recorded_steps()) == result["recorded"] + 1
        report("disk_full", method="tmpfs 48 MB" if mounted else "RLIMIT_FSIZE 48 MB",
               records_before_full=result["recorded"], harmed=0, calls_made_after_full=result["unrecorded_calls"])
    finally:
        if mounted:
            subprocess.run(["umount", "-l", disk], capture_output=True, timeout=30)


def test_the_size_cap_raises_journal_full_error_harms_nothing_and_can_be_raised(tmp_path):
    path = str(tmp_path / "journal")
    cap = 12 * MB
    with Journal(path, run="cap", map_size=64 * 1024, max_size=cap) as journal:
        step = 0
        with pytest.raises(JournalFullError, match="size cap") as info:
            while True:
                step += 1
                journal.record(step, {"x": torch.full((MB // 8,), step, dtype=torch.int64)})
        assert "nothing already recorded was harmed" in str(info.value)
        recorded = journal.recorded_steps()
        assert recorded == list(range(1, step)) and len(recorded) >= 8
        assert journal.verify() == []
        journal.record_bypass(step, mode="validate")  # small events still fit
    with Journal(path, run="cap", max_size=4 * cap) as journal:
        journal.record(step, {"x": torch.full((MB // 8,), step, dtype=torch.int64)})
        assert journal.recorded_steps() == list(range(1, step + 1))
        assert all(
            torch.equal(journal.load_output(journal.lookup(s))["x"], torch.full((MB // 8,), s)) for s in range(1, step + 1)
        )
        assert journal.verify() == []
    report("size_cap", cap_bytes=cap, records_before_cap=step - 1, harmed=0)


def test_a_payload_larger_than_the_cap_fails_at_once_and_the_journal_goes_on(tmp_path):
    path = str(tmp_path / "journal")
    with Journal(path, max_size=4 * MB) as journal:
        journal.record(1, {"x": torch.zeros(10)})
        with pytest.raises(JournalFullError):
            journal.record(2, {"x": torch.zeros(2 * MB)})  # 16 MB
        journal.record(3, {"x": torch.ones(10)})
        assert journal.recorded_steps() == [1, 3] and journal.verify() == []
