"""The big-payload scale run (issue 17): a journal of 1 000 steps of the 86 MB benchmark batch, zstd.

``python -m benchmarks._scale_big [--steps N] [--workdir DIR] [--keep] [--journal PATH] [--quick]`` (the second
half of ``make bench-scale``) prints a JSON report. The journal is built through the public API as a
trainer grows it: ``Journal(path, compression="zstd")`` (durable), one `Journal.record` per step of
the benchmark batch with one value changed each step (so every step stores a new payload). Then,
each in a fresh process, the way a user meets them:

- its size on disk, and the build's seconds per step;
- the first ``nearest`` / ``repeat`` / ``repeat_last`` decision through ``journaled(...)`` on a fresh
  handle (here the call also loads and decompresses the 86 MB step it serves);
- ``stepjournal runs --json``, ``audit --json``, the audit table's first screen, ``timeline`` and
  ``verify`` (wall and CPU time, and for verify the payload bytes it checked per second).

`--journal PATH` measures an existing journal instead of building one (it is not removed).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from ._measure import cli_command, disk_bytes, load_average, machine_facts, stamped
from ._scale import POLICIES, _first_screen, _python, add_place_arguments, scale_workdir
from ._workload import Workload, make_batch, mark, tensor_nbytes

__all__ = ["build_big_journal", "bench_scale_big", "main"]

STEPS = 1_000

# Run in a fresh process: open the journal, wrap a generate function, time its first call.
_FIRST_DECISION = r"""
import json, sys, time
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
journal = Journal(path)
wrapped = journaled(lambda prompt: b"generated", journal, policy, input_of=None)
start = time.perf_counter()
out = wrapped("prompt", step=step)
took = time.perf_counter() - start
action = wrapped.last_outcome.action
journal.close()
print(json.dumps({"first_call_s": took, "open_s": start - opened, "codec_import_s": codec_import_s, "action": action,
                  "served_tensors": len(out) if isinstance(out, dict) else 0}))
"""


def build_big_journal(path: Path, steps: int, progress, workload: Workload = Workload()) -> Dict[str, Any]:
    """Record steps 1..`steps` of the benchmark batch, zstd, durable; a new payload each step."""
    from stepjournal import Journal

    batch = make_batch(workload)
    start = time.perf_counter()
    with Journal(str(path), compression="zstd") as journal:
        for step in range(1, steps + 1):
            mark(batch, float(step))
            journal.record(step, batch)
            if step % 100 == 0:
                progress(f"scale-big: {step} steps of {tensor_nbytes(batch) / 1e6:.0f} MB recorded")
    took = time.perf_counter() - start
    return {"steps": steps, "build_s": took, "s_per_step": took / steps, "payload_tensor_bytes": tensor_nbytes(batch),
            "compression": "zstd", "sync": True}


def _decisions(path: Path, steps: int, trials: int) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for policy in POLICIES:
        runs = [_python(["-c", _FIRST_DECISION, str(path), policy, str(steps + 10 + trial)]) for trial in range(trials)]
        out[policy] = {
            "first_call_s": statistics.median(r["first_call_s"] for r in runs),
            "open_s": statistics.median(r["open_s"] for r in runs),
            "action": runs[0]["action"],
            "served_tensors": runs[0]["served_tensors"],
        }
    return out


def bench_scale_big(workdir: Path, steps: int, progress, journal: Optional[Path] = None, *,
                    workload: Workload = Workload(), trials: int = 3) -> Dict[str, Any]:
    """Build (or take) the journal, then take every figure."""
    from stepjournal import Journal

    figures: Dict[str, Any] = {"load_average_before": load_average()}
    if journal is None:
        journal = workdir / "big"
        progress(f"scale-big: recording {steps} steps of the benchmark batch (zstd) into {journal}")
        figures["build"] = build_big_journal(journal, steps, progress, workload)
    with Journal(str(journal), readonly=True) as j:
        n_events, n_steps = j.last_seq(), j.step_count()
        payload = sum(e.output.nbytes for _, e in j.events() if getattr(e, "output", None) is not None)
    figures["journal"] = {"events": n_events, "recorded_steps": n_steps, "payload_bytes": payload,
                          "disk": disk_bytes(str(journal))}
    progress("scale-big: first decisions through journaled(...) in fresh processes")
    # A copy, so that the decisions' own events do not change the journal the other figures read.
    decided = workdir / "decided"
    shutil.copytree(journal, decided)
    figures["decisions"] = _decisions(decided, n_steps, trials)
    shutil.rmtree(decided)
    progress("scale-big: runs --json, audit --json, the audit table's first screen, timeline, verify")
    figures["runs_json"] = cli_command(["runs", "--json", str(journal)])
    figures["audit_json"] = cli_command(["audit", "--json", str(journal)])
    figures["audit_first_screen"] = _first_screen(journal)
    figures["timeline"] = cli_command(["timeline", str(journal), "--out", str(workdir / "timeline.png")])
    verify = cli_command(["verify", str(journal)], timeout=3600)
    verify["payload_bytes_per_s"] = payload / verify["wall_s"]
    figures["verify"] = verify
    return figures


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: the report on stdout, progress on stderr; exits 0 whatever the figures say."""
    p = argparse.ArgumentParser(prog="python -m benchmarks._scale_big", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=STEPS, help=f"steps to record (default {STEPS})")
    add_place_arguments(p)
    p.add_argument("--quick", action="store_true", help="the quick workload's small batch instead of the 86 MB one")
    p.add_argument("--trials", type=int, default=3, help="fresh processes per first-decision figure (default 3)")
    args = p.parse_args(argv)
    started = time.perf_counter()
    with scale_workdir("stepjournal-scale-big-", args) as workdir:
        figures = bench_scale_big(workdir, args.steps, stamped, args.journal,
                                  workload=Workload.quick() if args.quick else Workload(), trials=args.trials)
    decision = max(figures["decisions"][p]["first_call_s"] for p in POLICIES)
    report = {
        "schema": 1,
        "machine": {**machine_facts(), "load_average_end": load_average()},
        "summary": {
            "on_disk_bytes": figures["journal"]["disk"]["allocated"],
            "payload_bytes": figures["journal"]["payload_bytes"],
            "build_s_per_step": figures.get("build", {}).get("s_per_step"),
            "first_decision_with_load_s": decision,
            **{f"{k}_s": figures[k]["wall_s"] for k in ("runs_json", "audit_json", "audit_first_screen", "timeline", "verify")},
            "verify_payload_gb_per_s": figures["verify"]["payload_bytes_per_s"] / 1e9,
        },
        "figures": figures,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
