"""`make bench-files` runs end to end at tiny sizes, each journal storing where it was told; speed is never asserted."""

from __future__ import annotations

import os
from pathlib import Path

from stepjournal.payloads._payload_store import FILE_FROM  # private: the store's internals

ROOT = Path(__file__).resolve().parents[2]


def test_the_file_threshold_bench_records_into_lmdb_and_into_files_and_reports_each_size(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))  # the benchmarks are the project's folder, not an installed package
    from benchmarks._bench_file_threshold import bench_file_threshold

    report = bench_file_threshold(tmp_path, reps=1, sizes=[1 << 14, 1 << 18])
    assert [row["bytes"] for row in report["rows"]] == [1 << 14, 1 << 18]
    assert all(row["lmdb_s"] > 0 and row["file_s"] > 0 for row in report["rows"])
    # Two records of each size in each journal (one warm-up, one timed): four files in one, none in the other.
    files = [n for d, _, names in os.walk(tmp_path / "file" / "payloads") for n in names]
    assert len(files) == 4 and not os.path.exists(tmp_path / "lmdb" / "payloads")
    import stepjournal.payloads._payload_store as payload_store  # private: the store's internals

    assert payload_store.FILE_FROM == FILE_FROM  # put back for every journal after it
