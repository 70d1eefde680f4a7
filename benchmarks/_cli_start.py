"""CLI start time (issues 14 and 17): ``stepjournal --help`` and ``--version`` in a fresh process."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any, Dict

__all__ = ["bench_cli_start"]

GOAL_S = 0.5


def bench_cli_start(reps: int = 5) -> Dict[str, Any]:
    """Median wall time of `reps` fresh ``python -m stepjournal --help`` / ``--version`` processes."""
    out: Dict[str, Any] = {"goals": {}}
    for flag in ("--help", "--version"):
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "stepjournal", flag], stdout=subprocess.DEVNULL, check=True)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        out[flag.lstrip("-")] = {"median_s": median, "times_s": [round(t, 4) for t in times]}
        out["goals"][f"cli_start_{flag.lstrip('-')}_s"] = {
            "measured": round(median, 4),
            "goal": GOAL_S,
            "op": "<=",
            "unit": "s",
            "met": median <= GOAL_S,
            "basis": f"python -m stepjournal {flag}, fresh process, median of {reps}",
        }
    return out
