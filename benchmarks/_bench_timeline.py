"""The timeline section: what ``stepjournal timeline`` costs on a long run (issue 17: 100 000 steps in 5 s).

The journal is grown as a trainer grows it, through the public API: a session under
``dump@1-5;repeat`` calling a journaled rollout once per step (and a bypassed validation call every
100 steps), then a resumed session replaying the first 1 000 steps exactly. Setup is not timed.

Reported:
- ``cli_s``: what a user pays: ``python -m stepjournal timeline JOURNAL --out t.png`` in a fresh
  process (imports, reading the journal, layout, drawing), the median of the repetitions. Goal: at most 5 s.
- ``read_s``, ``layout_s``, ``draw_png_s``, ``draw_html_s``: the parts, warm, in this process
  (`Journal.audit`, `build_timeline`, `render`).

Run it alone with ``python -m benchmarks._bench_timeline [--steps N] [--reps N] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict

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


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench_timeline(workdir: Path, steps: int, reps: int, say: Callable[[str], None]) -> Dict[str, Any]:
    """Build a journal of `steps` steps in `workdir`, time the timeline verb on it, return the figures."""
    from stepjournal import Journal
    from stepjournal.adapters.cli._timeline import build_timeline, render

    path = workdir / "journal"
    say(f"building a journal of {steps} steps (not timed)")
    t0 = time.perf_counter()
    build_journal(path, steps)
    build_s = time.perf_counter() - t0
    png = str(workdir / "t.png")
    cli = []
    for i in range(reps):
        say(f"timeline in a fresh process ({i + 1}/{reps})")
        cli.append(_timed(lambda: subprocess.run(
            [sys.executable, "-m", "stepjournal", "timeline", str(path), "--out", png],
            check=True, capture_output=True)))
    with Journal(path, readonly=True) as journal:
        read = [_timed(journal.audit) for _ in range(reps)]
        records = journal.audit()
    layout = [_timed(lambda: build_timeline(records, title="bench")) for _ in range(reps)]
    timeline = build_timeline(records, title="bench")
    draw_png = [_timed(lambda: render(timeline, png)) for _ in range(reps)]
    html = str(workdir / "t.html")
    draw_html = [_timed(lambda: render(timeline, html)) for _ in range(reps)]
    median = statistics.median
    figures = {
        "steps": steps,
        "calls": len(records),
        "segments": len(timeline.segments),
        "build_journal_s": round(build_s, 2),
        "cli_s": round(median(cli), 3),
        "cli_times_s": [round(t, 3) for t in cli],
        "read_s": round(median(read), 3),
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
    args = parser.parse_args(argv)
    quiet_logs()
    workdir = Path(tempfile.mkdtemp(prefix="stepjournal-bench-timeline-"))
    try:
        figures = bench_timeline(workdir, 2000 if args.quick else args.steps, 1 if args.quick else args.reps,
                                 lambda m: print(m, file=sys.stderr))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
