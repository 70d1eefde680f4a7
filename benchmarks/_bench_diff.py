"""The diff section: what `stepjournal diff` costs when runs agree (digests only) and on one differing batch.

- ``equal_1000``: one journal, a session recording 1 000 steps and a second replaying all of them (the
  common case: a replayed run against its recording); diff the two sessions. Nothing is decoded.
  Goal: at most 1 s.
- ``differing_pair``: the benchmark batch against the same batch with one log-prob changed, in two
  journals; diff the one pair, against loading (digest check and decode) both payloads. Goal: at
  most 2x the loads.

Run it alone with ``python -m benchmarks._bench_diff [--quick]``; `bench_diff(ctx)` is the section for
`benchmarks._cli`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict

from ._measure import quiet_logs, settle, summarize
from ._report import _goal
from ._workload import Workload, make_batch, mark, tensor_nbytes

__all__ = ["bench_diff", "main"]

EQUAL_STEPS = 1000

_CHILD = """
import sys, time
t0 = time.perf_counter()
from stepjournal import Journal, diff_journals
t1 = time.perf_counter()
with Journal(sys.argv[1], readonly=True) as j:
    s = [e.session for _, e in j.sessions()]
    report = diff_journals(j, j, session_a=s[0], session_b=s[1])
t2 = time.perf_counter()
assert report.exit_code == 0 and report.payloads_loaded == 0
print(t1 - t0, t2 - t1)
"""


def _equal_journal(path: Path, steps: int, workload: Workload) -> None:
    from stepjournal import Journal

    batch = make_batch(workload)
    with Journal(path) as journal:
        for step in range(1, steps + 1):
            mark(batch, float(step))  # a new payload per step, as a real run has
            journal.record(step, batch)
    with Journal(path) as journal:
        for step in range(1, steps + 1):
            journal.record_replay(step, journal.lookup(step), policy="replay", reason="bench")


def bench_diff(ctx: Any) -> Dict[str, Any]:
    """Both figures; `ctx` is a `benchmarks._suite.Context` (workdir, workload, reps, batch, progress)."""
    from stepjournal import Journal, diff_journals

    return _bench(ctx.workdir, ctx.workload, ctx.reps, ctx.batch, ctx.progress, Journal, diff_journals)


def _bench(workdir: Path, workload: Workload, reps: int, batch: Dict[str, Any], progress: Callable[[str], None],
           Journal: Any, diff_journals: Any) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    equal_path = workdir / "diff-equal"
    progress(f"diff: recording {EQUAL_STEPS} steps and replaying them in a second session")
    _equal_journal(equal_path, EQUAL_STEPS, Workload.quick())
    times = []
    for _ in range(reps):
        settle()
        start = time.perf_counter()
        with Journal(equal_path, readonly=True) as journal:
            sessions = [e.session for _, e in journal.sessions()]
            report = diff_journals(journal, journal, session_a=sessions[0], session_b=sessions[1])
        times.append(time.perf_counter() - start)
        assert report.exit_code == 0 and report.payloads_loaded == 0 and len(report.pairs) == EQUAL_STEPS
    fresh = subprocess.run([sys.executable, "-c", _CHILD, str(equal_path)], capture_output=True, text=True, check=True)
    import_s, diff_s = (float(x) for x in fresh.stdout.split())
    out["equal_1000"] = {
        "steps": EQUAL_STEPS,
        "warm": summarize(times),
        "fresh_process": {"import_s": import_s, "diff_s": diff_s},
        "goal_s": 1.0,
        "met": diff_s <= 1.0 and summarize(times)["median_s"] <= 1.0,
    }

    progress(f"diff: one differing pair of the benchmark batch ({tensor_nbytes(batch) / 1e6:.0f} MB)")
    a_path, b_path = workdir / "diff-a", workdir / "diff-b"
    other = {k: (v.clone() if hasattr(v, "clone") else v.copy()) for k, v in batch.items()}
    mark(other, -123.0)
    for path, value in ((a_path, batch), (b_path, other)):
        with Journal(path) as journal:
            journal.record(1, value)
    load_times, diff_times = [], []
    with Journal(a_path, readonly=True) as ja, Journal(b_path, readonly=True) as jb:
        ref_a, ref_b = ja.lookup(1).event.output, jb.lookup(1).event.output
        for _ in range(reps):
            settle()
            start = time.perf_counter()
            ja.load(ref_a, step=1)
            jb.load(ref_b, step=1)
            load_times.append(time.perf_counter() - start)
            settle()
            start = time.perf_counter()
            report = diff_journals(ja, jb)
            diff_times.append(time.perf_counter() - start)
            assert report.pairs[0].state == "differing" and report.payloads_loaded == 2
    load, diff = summarize(load_times), summarize(diff_times)
    out["differing_pair"] = {
        "payload_bytes": tensor_nbytes(batch),
        "load_both": load,
        "diff": diff,
        "ratio": diff["median_s"] / load["median_s"],
        # The best of each: on a busy machine the medians carry other processes' noise.
        "ratio_min": diff["min_s"] / load["min_s"],
        "goal_ratio": 2.0,
        "met": diff["median_s"] <= 2.0 * load["median_s"],
        "first_divergence": report.summary,
    }
    out["goals"] = {
        "diff_equal_1000_steps_s": _goal(diff_s, 1.0, "<=", "s", f"{EQUAL_STEPS} replayed steps vs their recording, "
                                         "digests only, fresh process (import excluded)"),
        "diff_differing_pair_vs_loads": _goal(out["differing_pair"]["ratio"], 2.0, "<=", "x",
                                              "one differing benchmark batch vs loading both payloads"),
    }
    return out


def main(argv: Any = None) -> int:
    """Run the diff section alone and print its figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks._bench_diff")
    parser.add_argument("--quick", action="store_true", help="the small workload and 3 repetitions")
    parser.add_argument("--reps", type=int)
    args = parser.parse_args(argv)
    quiet_logs()
    from stepjournal import Journal, diff_journals

    workload = Workload.quick() if args.quick else Workload()
    workdir = Path(tempfile.mkdtemp(prefix="stepjournal-bench-diff-"))
    try:
        figures = _bench(workdir, workload, args.reps or (3 if args.quick else 7), make_batch(workload),
                         lambda m: print(m, file=sys.stderr), Journal, diff_journals)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
