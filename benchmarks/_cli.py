"""`python -m benchmarks`: run every measurement once and print the JSON report."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from rich.console import Console
from rich.table import Table

from ._bench_diff import bench_diff
from ._bench_group_commit import bench_group_commit
from ._bench_record_growing import bench_record_growing
from ._bench_record_isolated import bench_record_isolated
from ._bench_remote import bench_remote
from ._bench_retention import bench_retention
from ._bench_share_cli import bench_share_cli
from ._bench_verify import bench_verify
from ._cli_start import bench_cli_start, bench_verb_start
from ._measure import load_average, machine_facts, quiet_logs
from ._report import goals_and_ratios
from ._suite import Context, bench_lookup, bench_passthrough, bench_record, bench_replay, bench_scan
from ._workload import Workload, make_batch, tensor_nbytes, to_dataproto

__all__ = ["main", "run"]

REPORT_SCHEMA = 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmark stepjournal against plain files and verl on one rollout batch; print a JSON report.",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes and few repetitions (the test suite's smoke run)")
    p.add_argument("--out", type=Path, help="also write the report to this file")
    p.add_argument("--reps", type=int, help="timed repetitions per figure (default 7, quick 3)")
    p.add_argument("--lookup-steps", type=int, help="recorded steps for the lookup figure (default 100000)")
    p.add_argument("--scan-steps", type=int, help="verl step folders for the scan figure (default 100000)")
    p.add_argument("--workdir", type=Path, help="where to write, on the disk to measure (default: the system temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the work folder")
    p.add_argument("--no-verl", action="store_true", help="leave verl out (its import alone takes seconds)")
    return p


def run(args: argparse.Namespace, console: Console) -> Dict[str, Any]:
    """Run every section and return the report."""
    quiet_logs()
    started = time.perf_counter()
    load_start = load_average()
    workload = Workload.quick() if args.quick else Workload()
    reps = args.reps or (3 if args.quick else 7)
    lookup_steps = args.lookup_steps or (300 if args.quick else 100_000)
    scan_steps = args.scan_steps or (100 if args.quick else 100_000)

    def progress(message: str) -> None:
        console.log(message)

    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    # A new folder of our own (inside --workdir when given), removed at the end unless --keep.
    workdir = Path(tempfile.mkdtemp(prefix="stepjournal-bench-", dir=args.workdir))
    if load_start and load_start[0] > 0.5:
        progress(f"load average {load_start[0]}: other processes are running, figures will be noisier")
    progress(f"building the workload {workload} in {workdir}")
    batch = make_batch(workload)
    dataproto = adapter = None
    adapter_note = None
    if not args.no_verl:
        dataproto = to_dataproto(batch)
        try:
            import stepjournal.adapters.verl  # noqa: F401  (registers the DataProto codec)

            adapter = True
        except ImportError as exc:
            adapter = False
            adapter_note = f"stepjournal.adapters.verl is not importable ({exc}); DataProto is not journaled"
    ctx = Context(
        workdir=workdir,
        workload=workload,
        reps=reps,
        lookup_steps=lookup_steps,
        scan_steps=scan_steps,
        batch=batch,
        dataproto=dataproto,
        adapter=bool(adapter),
        progress=progress,
        verl_cross_check=not args.no_verl,
    )
    figures: Dict[str, Any] = {}
    sections = {
        "record": bench_record,
        "record_growing": bench_record_growing,
        "group_commit": bench_group_commit,
        "record_isolated": bench_record_isolated,
        "replay": bench_replay,
        "lookup": bench_lookup,
        "passthrough": bench_passthrough,
        "scan": bench_scan,
        "cli_start": lambda _ctx: bench_cli_start(reps=1 if args.quick else 5),
        "verb_start": lambda ctx: bench_verb_start(ctx.workdir / "verb-start", reps=1 if args.quick else 5),
        "retention": bench_retention,
        "verify": bench_verify,
        "diff": bench_diff,
        "remote": bench_remote,
        "share_cli": bench_share_cli,
    }
    try:
        for name, section in sections.items():
            # Other processes on the same cores make every figure noisier: keep the load beside each.
            load = load_average()
            figures[name] = section(ctx)
            figures[name]["load_average_before"] = load
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    machine = machine_facts()
    machine["load_average_start"] = load_start
    machine["load_average_end"] = load_average()
    report: Dict[str, Any] = {
        "schema": REPORT_SCHEMA,
        "quick": bool(args.quick),
        "machine": machine,
        "workload": {
            "samples": workload.samples,
            "prompt_len": workload.prompt_len,
            "response_len": workload.response_len,
            "group": workload.group,
            "tensor_bytes": tensor_nbytes(batch),
            "formats_journaled": list(ctx.formats()),
            "goal_format": ctx.main_format,
            "verl_adapter": adapter_note or ("imported" if adapter else "not used"),
            "repetitions": reps,
            "workdir": str(workdir),
        },
        **goals_and_ratios(figures, ctx.main_format),
        "figures": figures,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    return report


def goal_table(goals: Dict[str, Any]) -> Table:
    """Every goal in one table: its target, what this run measured, and met / not met."""
    table = Table(title="goals", title_justify="left")
    for column in ("goal", "target", "measured", ""):
        table.add_column(column, justify="right" if column in ("target", "measured") else "left")
    for name, goal in goals.items():
        unit = goal.get("unit", "")
        measured = goal.get("measured")
        table.add_row(name, f"{goal.get('op', '')} {goal['goal']}{unit}",
                      "not measured" if measured is None else f"{measured:.3g}{unit}",
                      ("met" if goal["met"] else "NOT MET") + (f" ({_brief(goal['note'])})" if measured is None and "note" in goal else ""))
    return table


def _brief(note: str, width: int = 60) -> str:
    """A note cut to `width` characters for the table (the report's JSON keeps it whole)."""
    return note if len(note) <= width else note[: width - 1] + "…"


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: prints the report to stdout (progress to stderr); returns 0 whatever the goals say."""
    args = _parser().parse_args(argv)
    console = Console(stderr=True)
    report = run(args, console)
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    console.print(goal_table(report["goals"]))
    met = sum(goal["met"] for goal in report["goals"].values())
    console.log(f"{met} of {len(report['goals'])} goals met; elapsed {report['elapsed_s']} s")
    return 0
