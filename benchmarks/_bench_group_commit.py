"""Group commit: many callers of one process recording small tool responses at once, durably.

Each figure runs in a fresh process with a fresh journal opened with the defaults (durable commits, a
map that grows by itself). ``callers`` threads start together and each records ``per_caller`` 1 KiB tool
responses, one after another, through the public API (``Journal.record``, a tool stage, or
``journaled_tool`` with ``"dump"``). Each call is timed around the call: the tool itself returns at
once, so a call's time is what journaling added to it. With ``--via arecord`` the callers are coroutines
of one event loop awaiting ``Journal.arecord`` (an agent loop's tool calls: verl's and TRL's are
coroutines), not threads; with ``--via atool`` they are coroutines awaiting an ``async def`` tool under
``journaled_tool`` with ``"dump"`` (the path verl's and TRL's tool adapters take). The figures: durable records a second (all records over the wall time from the
start to the last acknowledgement) and the calls' p50 and p99.

Each row is measured twice, interleaved in the order the rows are run: with group commit (the
journal's default) and with one durable commit per call (the appender's ``group = False``: each
record committed alone, as before group commit), so both columns pay the same disk at the same time.

Goals (issue 49): at 64 callers >= 20 000 records a second and p99 <= 1 ms; one caller no slower
than one commit per call. Run it alone with ``python -m benchmarks._bench_group_commit``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from ._measure import quiet_logs
from ._report import _goal

__all__ = ["bench_group_commit", "main", "CALLERS"]

CALLERS = (1, 8, 64, 256)
RESPONSE_BYTES = 1024
GOAL_RECORDS_PER_S = 20_000
GOAL_P99_S = 0.001


def _child(workdir: Path, callers: int, per_caller: int, group: bool, via: str) -> Dict[str, Any]:
    """One figure, in this (fresh) process."""
    from stepjournal import Journal
    from stepjournal.adapters import journaled_tool
    from stepjournal.storage._appender import appender_of  # the one-commit-per-call switch (internal)

    quiet_logs()
    journal = Journal(workdir / "journal")
    appender_of(journal).group = group
    text = "r" * RESPONSE_BYTES
    tool = journaled_tool(lambda query: text, journal, "search", "dump")
    latencies: List[List[float]] = [[] for _ in range(callers)]
    journal.record(0, {"text": text}, stage="tool.search")  # the session opens, the first pages grow (not timed)
    if via in ("arecord", "atool"):
        wall = _coroutines(journal, text, callers, per_caller, latencies, via)
        journal.close()
        return _figures(callers, latencies, wall)
    start = threading.Barrier(callers + 1)

    def caller(c: int) -> None:
        own = latencies[c]
        start.wait()
        for i in range(per_caller):
            index = c * per_caller + i
            began = time.perf_counter()
            if via == "tool":
                tool.at(step=1, sample=index, turn=0)(query=f"q{index}")
            else:
                journal.record(1, {"text": text}, gen_index=index, stage="tool.search")
            own.append(time.perf_counter() - began)

    threads = [threading.Thread(target=caller, args=(c,)) for c in range(callers)]
    for thread in threads:
        thread.start()
    start.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began
    journal.close()
    return _figures(callers, latencies, wall)


def _coroutines(journal: Any, text: str, callers: int, per_caller: int, latencies: List[List[float]],
                via: str) -> float:
    """`callers` coroutines of one event loop, each awaiting `arecord` (or an async journaled tool) `per_caller`
    times; the wall time."""
    from stepjournal.adapters import journaled_tool

    async def search(query: str) -> str:
        return text

    tool = journaled_tool(search, journal, "search", "dump") if via == "atool" else None

    async def caller(c: int) -> None:
        own = latencies[c]
        for i in range(per_caller):
            index = c * per_caller + i
            began = time.perf_counter()
            if tool is not None:
                await tool.at(step=1, sample=index, turn=0)(query=f"q{index}")
            else:
                await journal.arecord(1, {"text": text}, gen_index=index, stage="tool.search")
            own.append(time.perf_counter() - began)

    async def main() -> float:
        began = time.perf_counter()
        await asyncio.gather(*(caller(c) for c in range(callers)))
        return time.perf_counter() - began

    return asyncio.run(main())


def _figures(callers: int, latencies: List[List[float]], wall: float) -> Dict[str, Any]:
    calls = sorted(t for own in latencies for t in own)
    return {
        "callers": callers, "records": len(calls), "wall_s": wall, "records_per_s": len(calls) / wall,
        "p50_s": calls[len(calls) // 2], "p99_s": calls[min(len(calls) - 1, int(len(calls) * 0.99))],
        "mean_s": statistics.fmean(calls),
    }


def _run_child(workdir: Path, callers: int, per_caller: int, group: bool, via: str) -> Dict[str, Any]:
    folder = workdir / f"{via}-{callers}-{'group' if group else 'alone'}"
    folder.mkdir(parents=True)
    command = [sys.executable, "-m", "benchmarks._bench_group_commit", "--child", str(folder), "--callers",
               str(callers), "--per-caller", str(per_caller), "--via", via] + ([] if group else ["--alone"])
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    shutil.rmtree(folder, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"group-commit child failed ({done.returncode}): {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _run(workdir: Path, *, records: int, callers=CALLERS, via: str = "record",
         progress: Callable[[str], None] = lambda _m: None) -> Dict[str, Any]:
    rows: Dict[str, Any] = {}
    for n in callers:
        per_caller = max(2, records // n)
        progress(f"group commit: {n} callers x {per_caller} records of {RESPONSE_BYTES} B through {via}")
        rows[str(n)] = {"group_commit": _run_child(workdir, n, per_caller, True, via),
                        "one_commit_per_call": _run_child(workdir, n, per_caller, False, via)}
    out: Dict[str, Any] = {"via": via, "response_bytes": RESPONSE_BYTES, "rows": rows, "goals": {}}
    if "64" in rows:
        who = "64 coroutines of one event loop" if via in ("arecord", "atool") else "64 threads"
        basis = f"{who}, fresh process and journal, durable, {RESPONSE_BYTES} B responses through {via}"
        at64 = rows["64"]["group_commit"]
        out["goals"]["group_commit_records_per_s_at_64"] = _goal(at64["records_per_s"], GOAL_RECORDS_PER_S, ">=",
                                                                 "records/s", basis)
        out["goals"]["group_commit_p99_at_64"] = _goal(at64["p99_s"], GOAL_P99_S, "<=", "s", basis)
    if "1" in rows:
        one = rows["1"]
        out["goals"]["group_commit_one_caller_vs_one_commit_per_call"] = _goal(
            one["group_commit"]["mean_s"] / one["one_commit_per_call"]["mean_s"], 1.0, "<=", "x",
            "one caller, mean call time, group commit against one commit per call")
    return out


def bench_group_commit(ctx: Any) -> Dict[str, Any]:
    """The section for `benchmarks._cli`; `ctx` is a `benchmarks._suite.Context`."""
    quick = ctx.reps <= 3 and ctx.lookup_steps <= 300
    # Quick: the two caller counts the goals read (each costs four fresh processes: threads and coroutines, each
    # with group commit and with one commit per call).
    records, callers = (64, (1, 64)) if quick else (2048, CALLERS)
    threads = _run(ctx.workdir / "group-commit", records=records, callers=callers, progress=ctx.progress)
    coroutines = _run(ctx.workdir / "group-commit-coroutines", records=records, callers=callers, via="arecord",
                      progress=ctx.progress)
    goals = dict(threads.pop("goals"))
    goals.update((f"{name}_coroutines", goal) for name, goal in coroutines.pop("goals").items())
    return {"threads": threads, "coroutines": coroutines, "goals": goals}


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks._bench_group_commit", description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=2048, help="records per figure (default 2048)")
    p.add_argument("--callers", type=int, action="append", help="callers of a figure (repeat; default 1 8 64 256)")
    p.add_argument("--via", choices=("record", "tool", "arecord", "atool"), default="record",
                   help="Journal.record from threads (default), journaled_tool with 'dump' from threads, "
                        "Journal.arecord from coroutines of one event loop, or an async journaled_tool with "
                        "'dump' from coroutines")
    p.add_argument("--workdir", type=Path, help="where to write, on the disk to measure (default: the system temp dir)")
    p.add_argument("--child", metavar="WORKDIR", help=argparse.SUPPRESS)
    p.add_argument("--per-caller", type=int, help=argparse.SUPPRESS)
    p.add_argument("--alone", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        (callers,) = args.callers
        print(json.dumps(_child(Path(args.child), callers, args.per_caller, not args.alone, args.via)))
        return 0
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="stepjournal-bench-group-commit-", dir=args.workdir))
    try:
        report = _run(workdir, records=args.records, callers=tuple(args.callers or CALLERS), via=args.via,
                      progress=lambda m: print(m, file=sys.stderr))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
