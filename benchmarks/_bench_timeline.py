"""The timeline section: what ``stepjournal timeline`` costs on a long run (issue 17: 100 000 steps in 5 s).

The journal is grown as a trainer grows it, through the public API: a session under
``dump@1-5;repeat`` calling a journaled rollout once per step (and a bypassed validation call every
100 steps), then a resumed session replaying the first 1 000 steps exactly. Setup is not timed.

Reported:
- ``cli_s``: what a user pays: ``python -m stepjournal timeline JOURNAL --out t.png`` in a fresh
  process (imports, reading the journal, layout, drawing), the median of the repetitions, with the
  child's CPU time (user + system) beside it (``cli_cpu_s``). Goal: at most 5 s.
- ``import_s``: the same fresh process importing what the verb imports, and nothing else.
- ``read_s``, ``layout_s``, ``draw_png_s``, ``draw_html_s``: the parts, warm, in this process
  (the verb's `read_rows`, `build_timeline_rows`, `render`); ``audit_s``: `Journal.audit`, which
  the verb read through before.

Run it alone with ``python -m benchmarks._bench_timeline [--steps N] [--reps N] [--quick] [--journal PATH]``.
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
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._measure import quiet_logs

__all__ = ["GOAL_S", "bench_timeline", "build_journal", "main"]

GOAL_S = 5.0


def build_journal(path: Path, steps: int) -> None:
    """A run of `steps` steps as a trainer writes it (see the module docstring)."""
    import torch

    from stepjournal import Journal, journaled

    def rollout(prompts: torch.Tensor, step: int) -> dict:
        return {"ids": prompts + step}

    prompts = torch.arange(4)
    with Journal(path, run="bench", sync=False) as journal:
        train = journaled(rollout, journal, "dump@1-5;repeat")
        validate = journaled(rollout, journal, "dump@1-5;repeat", mode_of=lambda *a, **k: "validate")
        for step in range(1, steps + 1):
            train(prompts, step=step)
            if step % 100 == 0:
                validate(prompts, step=step)
    with Journal(path, run="bench", sync=False) as journal:
        resumed = journaled(rollout, journal, "replay")
        for step in range(1, min(5, steps) + 1):
            resumed(prompts, step=step)


# What the verb imports before it reads (the CLI's start, the journal, matplotlib's PNG path).
_IMPORTS = ("import stepjournal.adapters.cli._app, stepjournal.adapters.cli._timeline, stepjournal; "
            "import matplotlib.figure, matplotlib.collections, matplotlib.backends.backend_agg")


def _child(argv: List[str]) -> Tuple[float, float]:
    """Wall and CPU seconds (user + system) of a child process that must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_timeline(workdir: Path, steps: int, reps: int, say: Callable[[str], None],
                   journal_path: Optional[Path] = None) -> Dict[str, Any]:
    """Build a journal of `steps` steps in `workdir` (or take the one `build_journal` made at
    `journal_path`), time the timeline verb on it, return the figures."""
    from stepjournal import Journal
    from stepjournal.adapters.cli._timeline import build_timeline_rows, read_rows, render

    path = journal_path or workdir / "journal"
    t0 = time.perf_counter()
    if journal_path is None:
        say(f"building a journal of {steps} steps (not timed)")
        build_journal(path, steps)
    build_s = time.perf_counter() - t0
    png = str(workdir / "t.png")
    cli, cli_cpu, imports = [], [], []
    for i in range(reps):
        say(f"timeline in a fresh process ({i + 1}/{reps})")
        wall, cpu = _child([sys.executable, "-m", "stepjournal", "timeline", str(path), "--out", png])
        cli.append(wall)
        cli_cpu.append(cpu)
        imports.append(_child([sys.executable, "-c", _IMPORTS])[0])
    with Journal(path, readonly=True) as journal:
        read = [_timed(lambda: read_rows(journal)) for _ in range(reps)]
        audit = [_timed(journal.audit) for _ in range(min(reps, 2))]
        rows = read_rows(journal)
    layout = [_timed(lambda: build_timeline_rows(rows, title="bench")) for _ in range(reps)]
    timeline = build_timeline_rows(rows, title="bench")
    draw_png = [_timed(lambda: render(timeline, png)) for _ in range(reps)]
    html = str(workdir / "t.html")
    draw_html = [_timed(lambda: render(timeline, html)) for _ in range(reps)]
    median = statistics.median
    figures = {
        "steps": len(timeline.steps),
        "calls": len(rows),
        "segments": len(timeline.segments),
        "build_journal_s": round(build_s, 2),
        "cli_s": round(median(cli), 3),
        "cli_cpu_s": round(median(cli_cpu), 3),
        "cli_times_s": [round(t, 3) for t in cli],
        "import_s": round(median(imports), 3),
        "read_s": round(median(read), 3),
        "audit_s": round(median(audit), 3),
        "layout_s": round(median(layout), 3),
        "draw_png_s": round(median(draw_png), 3),
        "draw_html_s": round(median(draw_html), 3),
        "png_bytes": os.path.getsize(png),
        "html_bytes": os.path.getsize(html),
        "goal_s": GOAL_S,
    }
    figures["goal_met"] = figures["cli_s"] <= GOAL_S
    return figures


def main(argv: Any = None) -> int:
    """Run the timeline section alone and print its figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks._bench_timeline")
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="2 000 steps, one repetition")
    parser.add_argument("--journal", type=Path, help="measure this journal (one `build_journal` made), build none")
    args = parser.parse_args(argv)
    quiet_logs()
    workdir = Path(tempfile.mkdtemp(prefix="stepjournal-bench-timeline-"))
    try:
        figures = bench_timeline(workdir, 2000 if args.quick else args.steps, 1 if args.quick else args.reps,
                                 lambda m: print(m, file=sys.stderr), args.journal)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
