"""Where payload files start to pay: a durable record of one payload in LMDB vs as a file, by size.

A journal stores a payload of `stepjournal.payloads._payload_store.FILE_FROM` bytes and more as a file of its
own (``payloads/``), written and fsynced before the event's LMDB transaction commits; a smaller one
rides in that transaction. This section measures where the line belongs. In one fresh process, two
journals grow side by side, one keeping every payload in LMDB and one writing every payload as a file;
for each size, each step records one new payload of that size into both, interleaved (the order
rotates), through `Journal.record`, the public API a trainer's adapter calls. The figure is the median
time per record and the ratio file / LMDB.

Run it with ``python -m benchmarks._bench_file_threshold [--reps N]``; ``make bench-files`` runs it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List

from ._measure import load_average, machine_facts, quiet_logs, settle

__all__ = ["bench_file_threshold", "main"]

SIZES = [1 << 14, 1 << 16, 1 << 18, 1 << 20, 1 << 21, 1 << 22, 6 << 20, 1 << 23, 12 << 20, 1 << 24, 1 << 26]


def bench_file_threshold(workdir: Path, reps: int, sizes: List[int] = SIZES) -> Dict[str, Any]:
    import torch

    import stepjournal.payloads._payload_store as payload_store
    from stepjournal import Journal

    quiet_logs()
    load_before = load_average()
    journals, default = {}, payload_store.FILE_FROM
    for name, file_from in (("lmdb", 1 << 62), ("file", 0)):
        payload_store.FILE_FROM = file_from  # read when the journal's own store is made
        journals[name] = Journal(workdir / name)  # its own store reads FILE_FROM now
    payload_store.FILE_FROM = default
    rows: List[Dict[str, Any]] = []
    step = 0
    for size in sizes:
        times: Dict[str, List[float]] = {"lmdb": [], "file": []}
        for rep in range(reps + 1):  # the first repetition warms up and is not kept
            step += 1
            value = {"x": torch.randint(0, 1 << 62, (size // 8,), dtype=torch.int64)}  # incompressible, new memory
            order = ["lmdb", "file"] if (rep + step) % 2 else ["file", "lmdb"]
            for name in order:
                settle()
                start = time.perf_counter()
                journals[name].record(step, value)
                if rep:
                    times[name].append(time.perf_counter() - start)
        lmdb_s, file_s = statistics.median(times["lmdb"]), statistics.median(times["file"])
        rows.append({"bytes": size, "lmdb_s": round(lmdb_s, 6), "file_s": round(file_s, 6),
                     "file_vs_lmdb": round(file_s / lmdb_s, 3)})
    for journal in journals.values():
        journal.close()
    return {"section": "file_threshold", "reps": reps, "machine": machine_facts(),
            "load_average": {"before": load_before, "after": load_average()}, "rows": rows}


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks._bench_file_threshold", description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=7, help="timed records per size and store (default 7)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="stepjournal-bench-files-") as workdir:
        report = bench_file_threshold(Path(workdir), args.reps)
    print(f"load average before {report['load_average']['before']}, after {report['load_average']['after']}",
          file=sys.stderr)
    for row in report["rows"]:
        print(f"{row['bytes']:>10} B  lmdb {row['lmdb_s'] * 1e3:8.2f} ms  file {row['file_s'] * 1e3:8.2f} ms  "
              f"file/lmdb {row['file_vs_lmdb']:.2f}", file=sys.stderr)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
