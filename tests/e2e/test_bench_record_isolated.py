"""The isolated record benchmark runs in a fresh process at a tiny size, times both writers each step and
counts the device flushes of every record; speed is never asserted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e  # a benchmark, in fresh processes: `make test-fast` leaves it out

ROOT = Path(__file__).resolve().parents[2]


def test_each_step_times_both_writers_and_counts_the_flushes_of_its_record():
    done = subprocess.run([sys.executable, "-m", "benchmarks._bench_record_isolated", "--quick", "--steps", "2"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["order"] == ["plain_write_fsync", "journal_dump", "journal_dump", "plain_write_fsync"]
    assert report["median_wall_s"]["journal_dump"] > 0 and report["median_wall_s"]["plain_write_fsync"] > 0
    flushes = report["flushes"]
    # The quick batch rides in LMDB (under FILE_FROM): its record flushes LMDB's commit, data and meta page.
    assert flushes["journal_fsyncs_per_record"] == [0, 0]
    assert flushes["lmdb_flushes_per_record"] == [2, 2] and flushes["per_record"] == [2, 2]
    assert report["goals"]["record_isolated_vs_plain_write_fsync"]["goal"] == 1.5
