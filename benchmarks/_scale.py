"""The scale run (issue 17): a journal of a million events, and what a user then pays for each answer.

``python -m benchmarks._scale [--events N] [--workdir DIR] [--keep] [--journal PATH]`` (``make
bench-scale``) prints a JSON report. The journal is built through the public API as a trainer grows
it: one `Journal.record` per step of a tiny prepared payload, steps 1..N ascending, with
``sync=False`` (the build is setup, not a figure; a durable build pays one flush per step). Every
figure is then taken in a fresh process, the way a user meets it:

- the first ``nearest`` / ``repeat`` / ``repeat_last`` decision through ``journaled(...)`` on a fresh
  handle (the engine's fingerprint check included), and the RSS it adds, at N steps and at 1 000
  (memory that does not grow with history means the two are alike);
- ``stepjournal reindex``, ``runs --json`` and ``audit --json`` on the journal (wall time of the
  command, start-up included), the same runs and audit rows timed inside one process, the audit
  table's first screen (the first 40 lines of ``audit --no-pager``), and the size on disk.

`--journal PATH` measures an existing journal instead of building one (it is not removed).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

from ._cli_start import bench_cli_start
from ._measure import cli_command, disk_bytes, load_average, machine_facts, quiet_logs, stamped

__all__ = ["build_journal", "bench_scale", "main"]

POLICIES = ("nearest", "repeat", "repeat_last")
SMALL_STEPS = 1_000

# Run in a fresh process: open the journal, wrap a generate function, time its first call.
_FIRST_DECISION = r"""
import json, sys, time
def rss(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
import torch  # noqa: F401  (a trainer has torch loaded before its first call)
from stepjournal import Journal
from stepjournal.adapters import journaled
# The codec is imported on the first payload decode; a trainer that records has it loaded, and the
# figure is the fresh handle's first decision, so the import is timed apart (codec_import_s).
imported = time.perf_counter()
import stepjournal.payloads._codec  # noqa: F401,E402
codec_import_s = time.perf_counter() - imported
path, policy, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
opened = time.perf_counter()
journal = Journal(path, sync=False)
wrapped = journaled(lambda prompt: b"generated", journal, policy, input_of=None)
before = rss("VmRSS")
start = time.perf_counter()
wrapped("prompt", step=step)
took = time.perf_counter() - start
after = rss("VmRSS")
outcome = wrapped.last_outcome
journal.close()
print(json.dumps({"first_call_s": took, "open_s": start - opened, "codec_import_s": codec_import_s, "rss_added_bytes": after - before,
                  "action": outcome.action}))
"""


def build_journal(path: Path, events: int, progress) -> Dict[str, Any]:
    """Record steps 1..`events` with a tiny payload, one `Journal.record` each (``sync=False``)."""
    from stepjournal import Journal

    start = time.perf_counter()
    with Journal(str(path), sync=False, map_size=max(1 << 30, events * 2048)) as journal:
        tiny = journal.prepare(b"x")
        for step in range(1, events + 1):
            journal.record(step, tiny)
            if step % 100_000 == 0:
                progress(f"scale: {step} steps recorded")
    took = time.perf_counter() - start
    return {"events": events, "build_s": took, "events_per_s": events / took, "sync": False}


def _python(args: List[str], *, timeout: float = 600) -> Dict[str, Any]:
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


# Run in a fresh process: one reading figure of the journal, timed inside the process (no CLI start).
_IN_PROCESS = r"""
import io, json, os, sys, time
from stepjournal import Journal
path, what = sys.argv[1], sys.argv[2]
opened = time.perf_counter()
journal = Journal(path, readonly=True)
start, cpu = time.perf_counter(), time.process_time()
out = {"open_s": start - opened}
if what == "runs":
    out["runs"] = len(journal.run_summaries())
elif what == "audit_json":
    from stepjournal.index._call_rows import json_rows, releases_of
    from stepjournal.adapters.cli._audit import _print_json_rows, _print_laid_out
    sink = open(os.devnull, "w", encoding="utf-8")
    sys.stdout, real = sink, sys.stdout
    texts = journal.stored_audit_rows(laid_out=True)  # as `stepjournal audit --json` reads them: the rows, else the log
    if texts is not None:
        _print_laid_out(texts)
    else:
        _print_json_rows(json_rows(journal.raw_events(), native=True, released_by=releases_of(journal.raw_events())))
    sys.stdout = real
    out["from"] = "rows projection" if texts is not None else "log"
    out["events"] = journal.last_seq()
out["s"], out["cpu_s"] = time.perf_counter() - start, time.process_time() - cpu
journal.close()
print(json.dumps(out))
"""


def _median_of(measure, times: int) -> Dict[str, Any]:
    """`measure()` `times` times in a row (each a fresh process): the median wall and CPU, and each one."""
    runs = [measure() for _ in range(times)]
    out = dict(runs[len(runs) // 2])
    out.update(wall_s=statistics.median(r["wall_s"] for r in runs), cpu_s=statistics.median(r.get("cpu_s", 0.0) for r in runs),
               walls_s=[round(r["wall_s"], 3) for r in runs], cpus_s=[round(r.get("cpu_s", 0.0), 3) for r in runs])
    return out


def _first_screen(path: Path, lines: int = 40, timeout: float = 300) -> Dict[str, Any]:
    """Seconds from starting ``stepjournal audit PATH --no-pager`` to its first `lines` lines (the table),
    and the CPU the process used until it was stopped there."""
    cpu = _children_cpu()
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "stepjournal", "audit", str(path), "--no-pager"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "120"})
    try:
        for _ in range(lines):
            if not proc.stdout.readline():
                break
        took = time.perf_counter() - start
    finally:
        proc.kill()
        proc.wait(timeout=timeout)
    return {"wall_s": took, "cpu_s": _children_cpu() - cpu, "lines": lines}


def _decisions(path: Path, steps: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for policy in POLICIES:
        # A step after the recorded range (every policy then serves a recorded step: nearest the
        # largest below, repeat cycles, repeat_last the last). Each in a fresh process; median of three.
        runs = [_python(["-c", _FIRST_DECISION, str(path), policy, str(steps + 10 + trial)]) for trial in range(3)]
        out[policy] = {
            "first_call_s": statistics.median(r["first_call_s"] for r in runs),
            "open_s": statistics.median(r["open_s"] for r in runs),
            "rss_added_bytes": statistics.median(r["rss_added_bytes"] for r in runs),
            "action": runs[0]["action"],
            "runs": runs,
        }
    return out


def bench_scale(workdir: Path, events: int, progress, journal: Optional[Path] = None, *,
                decisions: bool = True, audit_json: bool = True) -> Dict[str, Any]:
    """Build (or take) the journal, then measure every figure of issue 17 it allows."""
    figures: Dict[str, Any] = {"load_average_before": load_average()}
    if journal is None:
        journal = workdir / "scale"
        progress(f"scale: recording {events} steps (one event each) into {journal}")
        figures["build"] = build_journal(journal, events, progress)
    small = workdir / "small"
    build_journal(small, SMALL_STEPS, lambda _m: None)
    from stepjournal import Journal

    with Journal(str(journal), readonly=True) as j:
        n_events, n_steps = j.last_seq(), j.step_count()
    figures["journal"] = {"events": n_events, "recorded_steps": n_steps, "disk": disk_bytes(str(journal))}
    if decisions:
        progress("scale: first decisions through journaled(...) in fresh processes")
        figures["decisions"] = {"large": _decisions(journal, n_steps), "small": _decisions(small, SMALL_STEPS)}
    progress("scale: reindex, runs --json, audit --json, the audit table's first screen")
    # reindex first: a journal built by an older stepjournal then has the runs index that `runs` reads.
    reindex = cli_command(["reindex", str(journal)])
    reindex["events_per_s"] = n_events / reindex["wall_s"]
    figures["reindex"] = reindex
    figures["journal"]["disk_after_reindex"] = disk_bytes(str(journal))
    # What a user waits for from a fresh process, CLI start included: median of 5.
    figures["runs_json"] = _median_of(lambda: cli_command(["runs", "--json", str(journal)]), 5)
    figures["runs_in_process"] = _python(["-c", _IN_PROCESS, str(journal), "runs"])
    figures["audit_first_screen"] = _median_of(lambda: _first_screen(journal), 5)
    if audit_json:
        audit = cli_command(["audit", "--json", str(journal)])
        audit["events_per_s"] = n_events / audit["wall_s"]
        figures["audit_json"] = audit
        in_process = _python(["-c", _IN_PROCESS, str(journal), "audit_json"], timeout=1800)
        in_process["events_per_s"] = n_events / in_process["s"]
        figures["audit_json_in_process"] = in_process
    return figures


def scale_goals(figures: Dict[str, Any]) -> Dict[str, Any]:
    """Issue 17's goals that the scale run measures, each met or not."""

    def goal(measured: float, target: float, op: str, unit: str, basis: str) -> Dict[str, Any]:
        met = measured <= target if op == "<=" else measured >= target
        return {"measured": round(measured, 4), "goal": target, "op": op, "unit": unit, "met": bool(met), "basis": basis}

    n = figures["journal"]["recorded_steps"]
    goals: Dict[str, Any] = {}
    if "decisions" in figures:
        large, small = figures["decisions"]["large"], figures["decisions"]["small"]
        first = max(large[p]["first_call_s"] for p in POLICIES) * 1e3
        grow = max(large[p]["rss_added_bytes"] - small[p]["rss_added_bytes"] for p in POLICIES) / 2**20
        goals["first_decision_ms"] = goal(first, 5.0, "<=", "ms",
                                          f"max of {', '.join(POLICIES)}, journaled(...), fresh process, {n} steps")
        goals["first_decision_memory_growth_mib"] = goal(grow, 1.0, "<=", "MiB",
                                                         f"RSS added by the first decision at {n} vs {SMALL_STEPS} steps")
    if "audit_json" in figures:
        goals["audit_json_events_per_s"] = goal(figures["audit_json"]["events_per_s"], 300_000, ">=", "events/s",
                                                "stepjournal audit --json, wall time")
        goals["audit_json_in_process_events_per_s"] = goal(
            figures["audit_json_in_process"]["events_per_s"], 300_000, ">=", "events/s",
            "audit --json rows streamed to /dev/null in one process, no CLI start")
    return {
        **goals,
        "audit_first_screen_s": goal(figures["audit_first_screen"]["wall_s"], 0.5, "<=", "s",
                                     "stepjournal audit --no-pager to its first 40 lines, CLI start included, median of 5"),
        "runs_s": goal(figures["runs_json"]["wall_s"], 1.0, "<=", "s", "stepjournal runs --json, wall time, fresh process, median of 5"),
        "runs_in_process_s": goal(figures["runs_in_process"]["s"], 1.0, "<=", "s",
                                  "Journal.run_summaries() on a fresh read-only handle (the open apart)"),
        "reindex_s": goal(figures["reindex"]["wall_s"], 10.0, "<=", "s", "stepjournal reindex, wall time"),
    }


@contextmanager
def scale_workdir(prefix: str, args: argparse.Namespace) -> Iterator[Path]:
    """A new work folder (inside ``--workdir`` when given), removed afterwards unless ``--keep``."""
    quiet_logs()
    workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=args.workdir))
    try:
        yield workdir
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


def add_place_arguments(p: argparse.ArgumentParser) -> None:
    """--workdir, --keep and --journal: where a scale run writes, and which journal it measures."""
    p.add_argument("--workdir", type=Path, help="where to write (default: the system temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--journal", type=Path, help="measure this existing journal instead of building one")


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: the scale report on stdout, progress on stderr; exits 0 whatever the goals say."""
    p = argparse.ArgumentParser(prog="python -m benchmarks._scale", description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000, help="events (recorded steps) to build (default 1 000 000)")
    add_place_arguments(p)
    p.add_argument("--skip-decisions", action="store_true", help="leave out the first-decision figures")
    p.add_argument("--skip-audit-json", action="store_true", help="leave out the two full audit --json passes")
    args = p.parse_args(argv)
    progress = stamped
    started = time.perf_counter()
    with scale_workdir("stepjournal-scale-", args) as workdir:
        figures = bench_scale(workdir, args.events, progress, args.journal, decisions=not args.skip_decisions,
                              audit_json=not args.skip_audit_json)
        figures["cli_start"] = bench_cli_start()
    goals = scale_goals(figures)
    goals.update(figures["cli_start"]["goals"])
    report = {
        "schema": 1,
        "machine": {**machine_facts(), "load_average_end": load_average()},
        "goals": goals,
        "figures": figures,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=2))
    progress(f"{sum(g['met'] for g in goals.values())} of {len(goals)} goals met; elapsed {report['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
