"""The verify section (issue 17): ``stepjournal verify`` at >= 1 GB/s of payload on a warm page cache.

Two journals are grown through the public API (`Journal.record`, ``sync=False``: setup, not timed):

- ``batch``: the benchmark's rollout batch (86 MB of tensors by default) recorded at `steps` steps,
  a new payload each step (`mark`), as a trainer dumps;
- ``small``: `small` payloads of `small_bytes` random bytes each (many small rollouts).

Each journal's page cache is warmed by one untimed verify, then ``python -m stepjournal verify
JOURNAL`` runs in a fresh process `reps` times: wall time and the child's CPU time (user + system),
and GB/s of payload bytes (the stored bytes verify hashes) per wall second, CLI start included.
``in_process_s`` is `Journal.verify` alone on a fresh read-only handle, warm (no interpreter start).
``cold_*`` is the fresh process again with ``data.mdb`` first dropped from the page cache (as after a
reboot, or on a journal larger than memory): what the disk and the map's readahead give.

Run it alone with ``python -m benchmarks._bench_verify [--quick] [--steps N] [--small N]``;
`bench_verify(ctx)` is the section for `benchmarks._cli`.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from ._measure import evict_from_page_cache, load_average, quiet_logs, report_from_temp_dir
from ._workload import Workload, make_batch, mark

__all__ = ["GOAL_GB_S", "bench_verify", "main"]

GOAL_GB_S = 1.0


def _build_batch(path: Path, batch: Dict[str, Any], steps: int) -> int:
    from stepjournal import Journal

    stored = 0
    with Journal(path, run="bench", sync=False) as journal:
        for step in range(1, steps + 1):
            mark(batch, float(step))
            stored += journal.record(step, batch).event.output.stored_nbytes
    return stored


def _build_small(path: Path, count: int, nbytes: int) -> int:
    from stepjournal import Journal

    stored = 0
    with Journal(path, run="bench", sync=False) as journal:
        for step in range(1, count + 1):
            stored += journal.record(step, os.urandom(nbytes)).event.output.stored_nbytes
    return stored


def _cli_verify(path: Path) -> Dict[str, float]:
    """Wall and CPU seconds of one ``python -m stepjournal verify PATH`` (must find the journal whole)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "stepjournal", "verify", str(path)], capture_output=True, text=True)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"verify found problems or failed: {done.stdout}{done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "cpu_s": cpu}


def _in_process(path: Path) -> float:
    from stepjournal import Journal

    with Journal(path, readonly=True) as journal:
        started = time.perf_counter()
        problems = journal.verify()
        took = time.perf_counter() - started
    assert not problems, problems
    return took


def _measure(path: Path, payload_bytes: int, payloads: int, reps: int, say: Callable[[str], None]) -> Dict[str, Any]:
    _in_process(path)  # warms the page cache (and checks the journal is whole)
    runs: List[Dict[str, float]] = []
    inner: List[float] = []
    for rep in range(reps):
        say(f"verify: {path.name}, fresh process {rep + 1}/{reps}")
        runs.append(_cli_verify(path))
        inner.append(_in_process(path))  # alternated with the CLI runs: the same minute's load
    cold: List[Dict[str, float]] = []
    for rep in range(reps):
        say(f"verify: {path.name}, fresh process, cold page cache {rep + 1}/{reps}")
        evict_from_page_cache(str(path / "data.mdb"))
        cold.append(_cli_verify(path))
    wall = statistics.median(r["wall_s"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    in_process = statistics.median(inner)
    cold_wall = statistics.median(r["wall_s"] for r in cold)
    return {
        "payloads": payloads,
        "payload_bytes": payload_bytes,
        "data_mdb_bytes": os.path.getsize(path / "data.mdb"),
        "cli_wall_s": round(wall, 4),
        "cli_cpu_s": round(cpu, 4),
        "cli_times_s": [round(r["wall_s"], 4) for r in runs],
        "cli_gb_s": round(payload_bytes / wall / 1e9, 3),
        "in_process_s": round(in_process, 4),
        "in_process_gb_s": round(payload_bytes / in_process / 1e9, 3),
        "cold_wall_s": round(cold_wall, 4),
        "cold_cpu_s": round(statistics.median(r["cpu_s"] for r in cold), 4),
        "cold_gb_s": round(payload_bytes / cold_wall / 1e9, 3),
    }


def _bench(workdir: Path, workload: Workload, steps: int, small: int, small_bytes: int, reps: int,
           say: Callable[[str], None]) -> Dict[str, Any]:
    out: Dict[str, Any] = {"goals": {}, "load_average": load_average()}
    say(f"verify: recording {steps} steps of {workload} (setup, not timed)")
    batch_path = workdir / "verify-batch"
    stored = _build_batch(batch_path, make_batch(workload), steps)
    out["batch"] = {"steps": steps, **_measure(batch_path, stored, steps, reps, say)}
    shutil.rmtree(batch_path)
    say(f"verify: recording {small} payloads of {small_bytes} bytes (setup, not timed)")
    small_path = workdir / "verify-small"
    stored = _build_small(small_path, small, small_bytes)
    out["small"] = {"payload_size": small_bytes, **_measure(small_path, stored, small, reps, say)}
    shutil.rmtree(small_path)
    out["load_average_after"] = load_average()
    for name in ("batch", "small"):
        measured = out[name]["cli_gb_s"]
        out["goals"][f"verify_{name}_gb_s"] = {
            "measured": measured, "goal": GOAL_GB_S, "op": ">=", "unit": "GB/s", "met": measured >= GOAL_GB_S,
            "basis": f"stepjournal verify, fresh process, warm page cache, {out[name]['payloads']} payloads, "
                     f"{out[name]['payload_bytes'] / 1e6:.0f} MB",
        }
    return out


def bench_verify(ctx: Any) -> Dict[str, Any]:
    """The section for `benchmarks._cli`: `ctx` is a `benchmarks._suite.Context`."""
    quick = ctx.reps <= 3 and ctx.workload == Workload.quick()
    return _bench(ctx.workdir, ctx.workload, 8, 200 if quick else 2000, 64 << 10, 1 if quick else min(ctx.reps, 3),
                  ctx.progress)


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks._bench_verify", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="the quick workload, 200 small payloads, one repetition")
    p.add_argument("--steps", type=int, default=8, help="recorded steps of the batch (default 8)")
    p.add_argument("--small", type=int, default=2000, help="small payloads (default 2000)")
    p.add_argument("--small-bytes", type=int, default=64 << 10, help="bytes per small payload (default 64 KiB)")
    p.add_argument("--reps", type=int, default=3)
    args = p.parse_args(argv)
    quiet_logs()
    workload = Workload.quick() if args.quick else Workload()
    return report_from_temp_dir(
        "stepjournal-bench-verify-",
        lambda workdir: _bench(workdir, workload, args.steps, 200 if args.quick else args.small, args.small_bytes,
                               1 if args.quick else args.reps, lambda m: print(m, file=sys.stderr)))


if __name__ == "__main__":
    raise SystemExit(main())
