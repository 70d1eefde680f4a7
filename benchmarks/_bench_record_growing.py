"""The record section as a trainer records: a fresh process, a fresh journal growing by one batch a step.

``make bench``'s record section times warm writes into a journal whose map was sized up front. A
trainer does not record so: its process is new, its journal starts empty and grows, and each step's
batch is new memory. This section runs in a child process of its own and, for each of ``steps``
steps, makes a new batch (not timed), then times, in an order that rotates each step:

- ``plain_write_fsync``: the batch's tensor bytes written to a new file and fsynced;
- ``journal_dump``: the call through ``journaled(fn, journal, "dump")`` on a journal opened with the
  defaults (durable, map grown by itself), which is what a user of the library pays;
- ``verl_save_to_disk``: verl's rollout-skip dump of the same batch (``DataProto.save_to_disk``, no
  fsync), when verl is installed.

The child runs twice: with the process's allocator as it comes, and with glibc's allocator told to
keep freed memory for reuse (`TUNED_MALLOC`, the setting docs/performance.md "Recording and the
allocator" documents): LMDB copies each value into pages it mallocs per transaction, and by default
glibc maps fresh memory for them, and unmaps it after, every step.

Each journal record also reads the kernel's high-water mark of resident memory (``VmHWM``, reset just
before the call): what the record added above the batch it was handed.

Goals (issue 29): the journal at most 1.2x the plain write + fsync, faster than verl's dump, and a
record adding at most 10 % of the payload to the peak resident memory (no second copy of it).
Run it alone with ``python -m benchmarks._bench_record_growing [--steps N]``.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

from ._child import peak_reset, status_bytes
from ._measure import disk_bytes, quiet_logs, steps_bench_main
from ._report import _goal
from ._workload import Workload, make_batch, tensor_items, tensor_nbytes, to_dataproto

__all__ = ["TUNED_MALLOC", "bench_record_growing", "main"]

GOAL_VS_PLAIN = 1.2
GOAL_VS_VERL = 1.0
GOAL_RSS_VS_PAYLOAD = 0.10
# glibc's allocator: allocations under 1 GiB from the heap, and up to 1 GiB of freed memory kept there.
TUNED_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}


def _cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def _child(workdir: Path, steps: int, quick: bool) -> Dict[str, Any]:
    """The measurement itself, in this (fresh) process."""
    from stepjournal import Journal, journaled

    quiet_logs()
    workload = Workload.quick() if quick else Workload()
    journal = Journal(workdir / "journal")
    current: Dict[str, Any] = {}
    dump = journaled(lambda step: current["batch"], journal, "dump")

    def plain(step: int) -> None:
        folder = workdir / "plain"
        folder.mkdir(exist_ok=True)
        with open(folder / f"{step}.bin", "wb") as f:
            for t in tensor_items(current["batch"]):
                f.write(t.numpy().data)
            f.flush()
            os.fsync(f.fileno())

    def record(step: int) -> None:
        dump(step=step)

    def verl_save(step: int) -> None:
        folder = workdir / "verl" / str(step)
        folder.mkdir(parents=True)
        current["dataproto"].save_to_disk(folder / "gen_batch.dp")

    ops: Dict[str, Callable[[int], None]] = {"plain_write_fsync": plain, "journal_dump": record}
    wall: Dict[str, List[float]] = {name: [] for name in ops}
    cpu: Dict[str, List[float]] = {name: [] for name in ops}
    added: List[int] = []  # peak resident bytes each record added (empty where VmHWM cannot be reset)
    payload = 0
    for step in range(steps):
        batch = make_batch(workload, seed=step)  # a new batch: fresh memory, as each trainer step makes
        current["batch"] = batch
        payload = tensor_nbytes(batch)
        dataproto = to_dataproto(batch)
        if dataproto is not None and "verl_save_to_disk" not in ops:
            ops["verl_save_to_disk"] = verl_save
            wall["verl_save_to_disk"], cpu["verl_save_to_disk"] = [], []
        current["dataproto"] = dataproto
        names = list(ops)
        for name in names[step % len(names):] + names[: step % len(names)]:
            # The record's peak memory is read around it, outside its timing (VmHWM reset just before).
            before = status_bytes("VmRSS") if name == "journal_dump" and peak_reset() else None
            started_cpu, started = _cpu(), time.perf_counter()
            ops[name](step)
            wall[name].append(time.perf_counter() - started)
            cpu[name].append(_cpu() - started_cpu)
            if before is not None:
                added.append(max(0, (status_bytes("VmHWM") or 0) - before))
    journal.close()
    data = workdir / "journal" / "data.mdb"
    return {
        "steps": steps,
        "payload_tensor_bytes": payload,
        "wall_s": wall,
        "cpu_s": cpu,
        "record_peak_rss_added_bytes": added,
        "journal_data_mdb": {"apparent_bytes": os.path.getsize(data), **disk_bytes(str(data))},
        "journal_folder": disk_bytes(str(workdir / "journal")),  # data.mdb and the payload files
    }


def _median(samples: List[float]) -> float:
    # The first step pays the process's first touches (imports, the map's first pages); a trainer's
    # first step pays them too, so it is kept.
    return statistics.median(samples)


def bench_record_growing(ctx: Any) -> Dict[str, Any]:
    """The section for `benchmarks._cli`; `ctx` is a `benchmarks._suite.Context`."""
    quick = ctx.workload == Workload.quick()
    return _run(ctx.workdir / "record-growing", steps=3 if quick else 8, quick=quick, progress=ctx.progress)


def _run(workdir: Path, *, steps: int, quick: bool, progress: Callable[[str], None]) -> Dict[str, Any]:
    out = _run_child(workdir, steps=steps, quick=quick, progress=progress, env={})
    if platform.libc_ver()[0] == "glibc":
        out["tuned_malloc"] = _run_child(workdir, steps=steps, quick=quick, progress=progress, env=TUNED_MALLOC)
        out["tuned_malloc"]["env"] = TUNED_MALLOC
        for name, goal in out["tuned_malloc"].pop("goals").items():
            out["goals"][name.replace("record_growing", "record_growing_tuned_malloc", 1)] = goal
    return out


def _run_child(workdir: Path, *, steps: int, quick: bool, progress: Callable[[str], None],
               env: Dict[str, str]) -> Dict[str, Any]:
    workdir.mkdir(parents=True, exist_ok=True)
    progress(f"record as a trainer records: {steps} steps, a fresh process and a fresh journal"
             + (f", {' '.join(f'{k}={v}' for k, v in env.items())}" if env else ""))
    command = [sys.executable, "-m", "benchmarks._bench_record_growing", "--child", str(workdir), "--steps", str(steps)]
    if quick:
        command.append("--quick")
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent,
                          env={**os.environ, **env})
    shutil.rmtree(workdir, ignore_errors=True)
    if done.returncode != 0:
        raise RuntimeError(f"record-growing child failed ({done.returncode}): {done.stderr[-2000:]}")
    raw = json.loads(done.stdout)
    wall = {name: _median(t) for name, t in raw["wall_s"].items()}
    cpu = {name: _median(t) for name, t in raw["cpu_s"].items()}
    out: Dict[str, Any] = {**raw, "median_wall_s": wall, "median_cpu_s": cpu}
    basis = f"journaled(..., 'dump'), fresh process and journal, {steps} new batches, median wall" + (
        ", glibc allocator keeping freed memory (" + " ".join(f"{k}={v}" for k, v in env.items()) + ")" if env else "")
    out["ratios"] = {"journal_vs_plain_write_fsync": wall["journal_dump"] / wall["plain_write_fsync"]}
    added = raw["record_peak_rss_added_bytes"]
    out["ratios"]["record_peak_rss_added_vs_payload"] = max(added) / raw["payload_tensor_bytes"] if added else None
    out["goals"] = {
        "record_growing_vs_plain_write_fsync": _goal(out["ratios"]["journal_vs_plain_write_fsync"], GOAL_VS_PLAIN,
                                                     "<=", "x", basis),
        "record_growing_peak_rss_added_vs_payload": _goal(out["ratios"]["record_peak_rss_added_vs_payload"],
                                                          GOAL_RSS_VS_PAYLOAD, "<=", "x",
                                                          basis.replace("median wall", "largest step (VmHWM)")),
    }
    if "verl_save_to_disk" in wall:
        out["ratios"]["journal_vs_verl_save_to_disk"] = wall["journal_dump"] / wall["verl_save_to_disk"]
        out["goals"]["record_growing_vs_verl_save"] = _goal(out["ratios"]["journal_vs_verl_save_to_disk"],
                                                            GOAL_VS_VERL, "<=", "x", basis + ", vs verl's save_to_disk")
    return out


def main(argv: Any = None) -> int:
    return steps_bench_main(argv, module="_bench_record_growing", doc=__doc__, child=_child, run=_run,
                            hidden=("wall_s", "cpu_s"))

if __name__ == "__main__":
    raise SystemExit(main())
