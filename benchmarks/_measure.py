"""Timing, machine facts and the spawned child that replays with its own page tables and RSS."""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

__all__ = ["Timings", "timed", "summarize", "machine_facts", "load_average", "quiet_logs", "disk_bytes", "settle",
           "stamped", "report_from_temp_dir", "evict_from_page_cache", "cli_command"]


def quiet_logs() -> None:
    """Send stepjournal's log events to stderr at WARNING and above: stdout carries the JSON report.

    Real trainers configure logging too; benchmarking with info events rendered would time the renderer.
    """
    logger = logging.getLogger("stepjournal")
    logger.setLevel(logging.WARNING)
    if not logger.handlers:
        logger.addHandler(logging.StreamHandler(sys.stderr))


Timings = List[float]


def summarize(times: Timings) -> Dict[str, Any]:
    """Median (the figure every ratio uses), min, max and every repetition, in seconds."""
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "reps": len(times),
        "times_s": [round(t, 6) for t in times],
    }


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of `fn` takes (its result is dropped before returning)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def settle(warm_bytes: int = 0) -> None:
    """Level the ground before a timed write, outside the timed region.

    Flush every dirty page, so one measurement's writeback does not land in the next one's fsync
    (verl's dump is not durable: the kernel would flush it later). Then touch and free `warm_bytes` of
    memory: on a VM whose host backs guest memory lazily (this one), the first use of a free page
    costs several times the copy into it (86 MB of new page cache: ~45 ms warm, ~220 ms cold), and it
    would land on whichever writer happens to need fresh pages. After this every writer finds the
    same warm free memory.
    """
    os.sync()
    if warm_bytes:
        import numpy as np

        scratch = np.ones(warm_bytes, dtype=np.uint8)
        del scratch


def disk_bytes(path: str) -> Dict[str, int]:
    """Bytes a file or folder holds: allocated on disk (st_blocks) and apparent (st_size)."""
    allocated = apparent = 0
    paths = [path]
    if os.path.isdir(path):
        paths = [os.path.join(root, f) for root, _, files in os.walk(path) for f in files]
    for p in paths:
        st = os.stat(p)
        allocated += st.st_blocks * 512
        apparent += st.st_size
    return {"allocated": allocated, "apparent": apparent}


def evict_from_page_cache(path: str) -> None:
    """Drop the clean cached pages of the file `path` (written back first), as after a reboot.

    ``posix_fadvise(DONTNEED)`` needs no privileges; pages another process still maps stay cached.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def load_average() -> Optional[List[float]]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux/macOS
        return None


def _version(module: str) -> Optional[str]:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def machine_facts() -> Dict[str, Any]:
    """What the figures were measured on."""
    import lmdb
    import numpy
    import torch

    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS
        affinity = os.cpu_count()
    mem_total = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_total = int(line.split()[1]) * 1024
    except OSError:  # pragma: no cover - not Linux
        pass
    cpu_model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:  # pragma: no cover
        pass
    return {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu_model": cpu_model,
        "cpu_count": os.cpu_count(),
        "cpus_usable": affinity,
        "memory_bytes": mem_total,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": numpy.__version__,
        "py_lmdb": lmdb.__version__,
        "lmdb": ".".join(str(x) for x in lmdb.version()),
        "blake3": _version("blake3"),
        "zstandard": _version("zstandard"),
        "verl": _version("verl"),
        "tensordict": _version("tensordict"),
        "transparent_hugepages": _read_first("/sys/kernel/mm/transparent_hugepage/enabled"),
    }


def _read_first(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def maxrss_bytes() -> int:
    """Peak resident set size of this process so far (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _anon_bytes(pid: int) -> Optional[int]:
    """The process's private anonymous memory now (``RssAnon`` of /proc), None where that is unreadable."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cli_command(args: List[str], *, timeout: float = 900, every: float = 0.02) -> Dict[str, Any]:
    """``python -m stepjournal ARGS`` in a fresh process, its output discarded: what a user pays for it.

    Reported: wall time; CPU time (what the wall would be on an idle machine, roughly: load stretches only
    the wall); ``peak_rss_bytes``, the kernel's high-water mark of resident memory, which also counts the
    journal's pages the memory map brought in (clean file pages the kernel drops under pressure); and
    ``peak_anon_bytes``, the process's own memory (``RssAnon``), its highest value seen every `every`
    seconds (a sampled peak: a spike shorter than that can pass unseen). A command past `timeout` is
    killed and reported as a bound (``timed_out``, ``wall_s`` = `timeout`)."""
    with tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "stepjournal", *args], stdout=subprocess.DEVNULL,
                                stderr=errors)
        peak_anon, usage, status = 0, None, 0
        while usage is None:  # wait4 with WNOHANG, not poll(): the child's usage comes with its reaping
            pid, status, used = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                usage = used
                break
            peak_anon = max(peak_anon, _anon_bytes(proc.pid) or 0)
            if time.perf_counter() - start > timeout:
                proc.kill()
                os.wait4(proc.pid, 0)
                break
            time.sleep(every)
        took = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status) if usage is not None else -9  # reaped here
        errors.seek(0)
        stderr = errors.read().decode("utf-8", "replace")
    if usage is None:
        return {"wall_s": float(timeout), "rc": None, "timed_out": True, "stderr_tail": ""}
    rc = proc.returncode
    return {"wall_s": took, "rc": rc, "timed_out": False, "stderr_tail": stderr[-300:] if rc else "",
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_bytes": usage.ru_maxrss * (1 if sys.platform == "darwin" else 1024),
            "peak_anon_bytes": peak_anon or None}


def stamped(message: str) -> None:
    """Progress for a long run: the time and the message, on stderr."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def report_from_temp_dir(prefix: str, run: Callable[[Path], Dict[str, Any]]) -> int:
    """Run `run(workdir)` in a new temporary folder (removed after), print its report as JSON; 0."""
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        report = run(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0


def steps_bench_main(argv: Any, *, module: str, doc: str, child: Callable[..., Any], run: Callable[..., Any],
                     hidden: Tuple[str, ...]) -> int:
    """The command line of a benchmark that records `--steps` batches in a child process (`--child WORKDIR`,
    hidden): the parent runs `run` in a temporary folder and prints its report as JSON, less the `hidden` keys."""
    import argparse
    import json
    import shutil
    import sys
    import tempfile
    from pathlib import Path

    p = argparse.ArgumentParser(prog=f"python -m benchmarks.{module}", description=doc.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="steps to record (default 8)")
    p.add_argument("--quick", action="store_true", help="the quick workload's small batch")
    p.add_argument("--child", metavar="WORKDIR", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(Path(args.child), args.steps, args.quick)))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix=f"stepjournal-bench-{module.lstrip('_').replace('_', '-')}-"))
    try:
        report = run(workdir / "run", steps=args.steps, quick=args.quick, progress=lambda m: print(m, file=sys.stderr))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({k: v for k, v in report.items() if k not in hidden}, indent=2))
    return 0
