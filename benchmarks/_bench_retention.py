"""The retention section: what prune + compact give back on a 1 000-step journal, and what retention
costs while recording.

- ``disk``: a journal of 1 000 steps (the quick workload's batch, a new payload per step); the size of
  ``data.mdb`` as recorded, after ``prune --keep-last 50`` (LMDB reuses freed pages but never shrinks
  its file) and after ``compact``.
- ``record``: 1 000 records into a fresh journal without retention and into one opened with
  ``Retention(keep_last=50)`` (which releases one old step in each record's transaction), alternated
  ``reps`` times; median seconds per record. Goal: with retention at most 1.1x without.

Run it alone with ``python -m benchmarks._bench_retention [--quick]``; `bench_retention(ctx)` is the
section for `benchmarks._cli`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict

from ._measure import quiet_logs, report_from_temp_dir, settle
from ._workload import Workload, make_batch, mark

__all__ = ["bench_retention", "main"]

STEPS = 1000
KEEP_LAST = 50
GOAL_RATIO = 1.1


def _record(path: Path, steps: int, batch: Dict[str, Any], retention: Any) -> float:
    """Seconds per record of `steps` records into a new journal at `path`."""
    from stepjournal import Journal

    with Journal(path, retention=retention) as journal:
        started = time.perf_counter()
        for step in range(1, steps + 1):
            mark(batch, float(step))  # a new payload per step, as a real run has
            journal.record(step, batch)
        return (time.perf_counter() - started) / steps


def _data_bytes(path: Path) -> int:
    return os.path.getsize(path / "data.mdb")


def bench_retention(ctx: Any) -> Dict[str, Any]:
    """Both figures; `ctx` is a `benchmarks._suite.Context` (workdir, reps, progress)."""
    return _bench(ctx.workdir, ctx.reps, ctx.progress, steps=STEPS if ctx.reps > 3 else 200)


def _bench(workdir: Path, reps: int, progress: Callable[[str], None], *, steps: int) -> Dict[str, Any]:
    from stepjournal import Journal
    from stepjournal.upkeep import Retention, compact, prune

    batch = make_batch(Workload.quick())
    progress(f"retention: recording {steps} steps, with and without Retention(keep_last={KEEP_LAST}), {reps} times")
    plain, kept = [], []
    for rep in range(reps):
        for times, retention, name in ((plain, None, "plain"), (kept, Retention(keep_last=KEEP_LAST), "kept")):
            path = workdir / f"retention-{name}-{rep}"
            settle()
            times.append(_record(path, steps, batch, retention))
            if rep < reps - 1 or name == "kept":
                shutil.rmtree(path)
    journal_path = workdir / f"retention-plain-{reps - 1}"
    recorded = _data_bytes(journal_path)
    progress(f"retention: prune --keep-last {KEEP_LAST} and compact the {steps}-step journal")
    with Journal(journal_path, session=False) as journal:
        started = time.perf_counter()
        plan = prune(journal, Retention(keep_last=KEEP_LAST))
        prune_s = time.perf_counter() - started
    pruned = _data_bytes(journal_path)
    started = time.perf_counter()
    compact(journal_path)
    compact_s = time.perf_counter() - started
    compacted = _data_bytes(journal_path)
    shutil.rmtree(journal_path)
    ratio = statistics.median(kept) / statistics.median(plain)
    return {
        "steps": steps,
        "keep_last": KEEP_LAST,
        "disk": {
            "recorded_bytes": recorded,
            "after_prune_bytes": pruned,
            "after_compact_bytes": compacted,
            "released_records": len(plan.releases),
            "released_payload_bytes": plan.released_bytes,
            "prune_s": round(prune_s, 4),
            "compact_s": round(compact_s, 4),
        },
        "record": {
            "without_retention_s_per_record": statistics.median(plain),
            "with_retention_s_per_record": statistics.median(kept),
            "ratio": round(ratio, 4),
            "goal_ratio": GOAL_RATIO,
            "met": ratio <= GOAL_RATIO,
            "samples_without": plain,
            "samples_with": kept,
        },
    }


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks._bench_retention", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="200 steps, one repetition")
    args = p.parse_args(argv)
    quiet_logs()
    return report_from_temp_dir(
        "stepjournal-bench-retention-",
        lambda workdir: _bench(workdir, 1 if args.quick else 5, lambda m: print(m, file=sys.stderr),
                               steps=200 if args.quick else STEPS))


if __name__ == "__main__":
    raise SystemExit(main())
