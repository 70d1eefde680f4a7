"""CLI start time (issues 14, 17 and 48): ``--help`` / ``--version``, and each reading verb on the demo journal.

Each figure is the wall time of a fresh process, from its start to its exit, median of `reps`; the
verbs' processes alternate, so a burst of load on this shared machine lands on all of them alike.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Tuple

__all__ = ["bench_cli_start", "bench_verb_start", "make_demo", "verb_lines", "VerbLine"]

GOAL_S = 0.5
# Issue 48: a verb that prints no tensor starts in 0.3 s; `show` of a step, which decodes its payload, in 0.8 s.
VERB_GOAL_S = 0.3
SHOW_GOAL_S = 0.8
DEMO = ".stepjournal-demo"
REMOTE = "./demo-remote"


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


class VerbLine(NamedTuple):
    """One timed verb: its command line as typed in the folder `make demo` ran in, its goal in seconds, and
    the exit statuses of a finished run."""

    text: str
    goal_s: float
    statuses: Tuple[int, ...] = (0,)

    @property
    def argv(self) -> List[str]:
        """The words after ``stepjournal``."""
        return shlex.split(self.text)[1:]


def verb_lines() -> Dict[str, VerbLine]:
    """Each timed verb by name. `diff` compares the demo's replay (session s2) with the recording it
    replayed: equal digests, no payload loaded; it exits 1 because s2 also replayed steps 7-8, which the
    recording lacks."""
    return {
        "diff": VerbLine(f"stepjournal diff {DEMO} {DEMO} --session-b s2", VERB_GOAL_S, (0, 1)),
        "audit": VerbLine(f"stepjournal audit {DEMO}", VERB_GOAL_S),
        "runs": VerbLine(f"stepjournal runs {DEMO}", VERB_GOAL_S),
        "status": VerbLine(f"stepjournal status {DEMO} {REMOTE}", VERB_GOAL_S),
        "show": VerbLine(f"stepjournal show {DEMO} 1", SHOW_GOAL_S),
        "show_text": VerbLine(f"stepjournal show {DEMO} 1 --text", SHOW_GOAL_S),
    }


def _stepjournal() -> List[str]:
    """The ``stepjournal`` command this interpreter's environment installed (what a user types)."""
    script = Path(sys.executable).parent / "stepjournal"
    return [str(script)] if script.exists() else [sys.executable, "-m", "stepjournal"]


def _run(words: List[str], folder: Path) -> Tuple[float, float, int, str]:
    """(wall s, CPU s, exit status, stderr's last line) of one fresh process in `folder`, stdout discarded.

    The CPU time (user + system, from the reaping ``wait4``) is about what the wall would be on an idle
    machine: load from other processes stretches only the wall."""
    start = time.perf_counter()
    proc = subprocess.Popen(words, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    errors = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    last = errors.strip().splitlines()[-1:] or [""]
    return took, usage.ru_utime + usage.ru_stime, proc.returncode, last[0]


def make_demo(folder: Path) -> None:
    """`make demo`'s journal in `folder`, and a folder remote holding all of it (what `status` compares)."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "stepjournal.adapters.demo"], cwd=folder, stdout=subprocess.DEVNULL,
                   check=True, timeout=900)
    subprocess.run([*_stepjournal(), "push", DEMO, REMOTE], cwd=folder, stdout=subprocess.DEVNULL, check=True,
                   timeout=300)


def bench_verb_start(folder: Path, reps: int = 5) -> Dict[str, Any]:
    """Median wall time of `reps` fresh processes of each of `verb_lines` on a fresh demo journal."""
    make_demo(folder)
    base = _stepjournal()
    lines = verb_lines()
    # The figure of `diff` is the one with no payload loaded: checked once, untimed.
    diff_json = subprocess.run([*base, *lines["diff"].argv, "--json"], cwd=folder, capture_output=True, text=True,
                               timeout=300)
    loaded = json.loads(diff_json.stdout)["payloads_loaded"] if diff_json.returncode in (0, 1) else None
    assert loaded == 0, (loaded, diff_json.stderr)
    walls: Dict[str, List[float]] = {verb: [] for verb in lines}
    cpus: Dict[str, List[float]] = {verb: [] for verb in lines}
    failed: Dict[str, str] = {}
    for _ in range(reps):
        for verb, line in lines.items():
            wall, cpu, status, last = _run([*base, *line.argv], folder)
            if status not in line.statuses:
                failed[verb] = f"exited {status}: {last}"
            walls[verb].append(wall)
            cpus[verb].append(cpu)
    out: Dict[str, Any] = {"goals": {}, "stepjournal": " ".join(base)}
    for verb, line in lines.items():
        median = None if verb in failed else statistics.median(walls[verb])
        out[verb] = {"line": line.text, "median_s": median, "cpu_median_s": statistics.median(cpus[verb]),
                     "times_s": [round(t, 4) for t in walls[verb]]}
        row: Dict[str, Any] = {
            "measured": None if median is None else round(median, 4), "goal": line.goal_s, "op": "<=", "unit": "s",
            "met": median is not None and median <= line.goal_s,
            "basis": f"{line.text}, typed in make demo's folder, fresh process, median of {reps}",
        }
        if verb in failed:
            row["note"] = f"not measured: {failed[verb]}"
        out["goals"][f"cli_start_{verb}_s"] = row
    return out
