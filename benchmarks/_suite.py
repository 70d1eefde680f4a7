"""The measurements. Each section returns plain figures (seconds, bytes); `_report` turns them into ratios.

Every timed figure is the median of several warm repetitions taken in this one run. Writers that are
compared with each other run interleaved (in a rotating order) and each starts after `settle()`, so they
meet the same page cache and disk conditions.
"""

from __future__ import annotations

import os
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

import attrs

from ._child import replay_in_child
from ._measure import disk_bytes, settle, summarize, timed
from ._workload import Workload, mark, tensor_items, tensor_nbytes

__all__ = ["Context", "bench_record", "bench_replay", "bench_lookup", "bench_scan", "bench_passthrough"]


@attrs.define
class Context:
    """What every section needs: where to write, how big, how many repetitions."""

    workdir: Path
    workload: Workload
    reps: int
    lookup_steps: int
    scan_steps: int
    batch: Dict[str, Any]
    dataproto: Any  # verl DataProto of the same batch, or None without verl
    adapter: bool  # stepjournal.adapters.verl imported: DataProto can be journaled
    progress: Callable[[str], None]
    verl_cross_check: bool = True
    # Filled by bench_record for the sections after it.
    replay_sources: Dict[str, Dict[str, Any]] = attrs.field(factory=dict)

    @property
    def payload_nbytes(self) -> int:
        return tensor_nbytes(self.batch)

    def formats(self) -> Dict[str, Any]:
        """The values stepjournal records: the dict always, the DataProto when the verl adapter is there."""
        out: Dict[str, Any] = {"dict": self.batch}
        if self.adapter and self.dataproto is not None:
            out["dataproto"] = self.dataproto
        return out

    @property
    def main_format(self) -> str:
        return "dataproto" if "dataproto" in self.formats() else "dict"


def _map_size(ctx: Context, records: int) -> int:
    # Sized up front so that no map growth lands inside a timed record (growth is rare in a real run).
    need = (records + 4) * ctx.payload_nbytes * 2 + (64 << 20)
    size = 1 << 30
    while size < need:
        size *= 2
    return size


# -- record ------------------------------------------------------------------------------------------


def bench_record(ctx: Context) -> Dict[str, Any]:
    """stepjournal's durable record vs a plain write + fsync of the tensor bytes vs verl's save_to_disk."""
    from stepjournal import Journal

    base = ctx.workdir / "record"
    formats = ctx.formats()
    main = ctx.main_format
    map_size = _map_size(ctx, ctx.reps + 2)
    journals = {fmt: Journal(base / f"journal-{fmt}", map_size=map_size) for fmt in formats}
    zstd = Journal(base / "journal-zstd", compression="zstd", map_size=map_size)
    tensors = tensor_items(ctx.batch)
    stored: Dict[str, int] = {}

    def plain(rep: int) -> None:
        folder = base / "plain" / str(rep)
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "tensors.bin", "wb") as f:
            for t in tensors:
                f.write(t.numpy().data)
            f.flush()
            os.fsync(f.fileno())

    def verl_save(rep: int) -> None:
        # verl's SkipManager layout: one folder per step, gen_batch.dp written with save_to_disk (no fsync).
        folder = base / "verl" / str(rep)
        folder.mkdir(parents=True, exist_ok=True)
        ctx.dataproto.save_to_disk(folder / "gen_batch.dp")

    def recorder(fmt: str, journal, value) -> Callable[[int], None]:
        def record(rep: int) -> None:
            recorded = journal.record(rep, value)
            stored[fmt] = recorded.event.output.stored_nbytes

        return record

    ops: Dict[str, Callable[[int], None]] = {"plain_write_fsync": plain}
    for fmt, value in formats.items():
        ops[f"journal_record_{fmt}"] = recorder(fmt, journals[fmt], value)
    ops["journal_record_zstd"] = recorder("zstd", zstd, formats[main])
    if ctx.dataproto is not None:
        ops["verl_save_to_disk"] = verl_save

    times: Dict[str, List[float]] = {name: [] for name in ops}
    names = list(ops)
    ctx.progress(f"record: warm-up, then {ctx.reps} interleaved repetitions of {', '.join(names)}")
    mark(ctx.batch, 0.0)
    for op in ops.values():  # warm-up: imports, first map pages, allocator pools
        op(0)
    settle()
    sizes_before = {fmt: disk_bytes(str(j.path))["allocated"] for fmt, j in journals.items()}
    sizes_before["zstd"] = disk_bytes(str(zstd.path))["allocated"]
    warm = 3 * ctx.payload_nbytes + (64 << 20)  # encode buffer + LMDB's dirty pages + page cache
    for rep in range(1, ctx.reps + 1):
        mark(ctx.batch, -float(rep))
        order = names[rep % len(names) :] + names[: rep % len(names)]
        for name in order:
            settle(warm)
            times[name].append(timed(lambda: ops[name](rep)))
    settle()
    # Files are removed only now: freeing them inside the loop would hand their warm pages (and, with
    # a discard mount, their trimming) to whichever writer came next.
    for kind in ("plain", "verl"):
        for rep in range(ctx.reps):
            shutil.rmtree(base / kind / str(rep), ignore_errors=True)
    growth = {fmt: (disk_bytes(str(j.path))["allocated"] - sizes_before[fmt]) / ctx.reps for fmt, j in journals.items()}
    growth["zstd"] = (disk_bytes(str(zstd.path))["allocated"] - sizes_before["zstd"]) / ctx.reps
    last = ctx.reps
    for j in [*journals.values(), zstd]:
        j.close()

    out: Dict[str, Any] = {name: summarize(t) for name, t in times.items()}
    plain_file = base / "plain" / str(last) / "tensors.bin"
    out["sizes"] = {
        "payload_tensor_bytes": ctx.payload_nbytes,
        "plain_file_bytes": disk_bytes(str(plain_file))["allocated"],
        "journal_stored_payload_bytes": stored,
        "journal_disk_growth_per_step_bytes": growth,
    }
    ctx.replay_sources = {"plain": {"kind": "plain", "path": str(plain_file)}}
    for fmt in formats:
        ctx.replay_sources[f"journal_{fmt}"] = {
            "kind": "journal", "path": str(base / f"journal-{fmt}"), "step": last, "dataproto": fmt == "dataproto",
        }
    ctx.replay_sources["journal_zstd"] = {
        "kind": "journal", "path": str(base / "journal-zstd"), "step": last, "dataproto": main == "dataproto",
    }
    if ctx.dataproto is not None:
        dp_file = base / "verl" / str(last) / "gen_batch.dp"
        out["sizes"]["verl_dp_bytes"] = disk_bytes(str(dp_file))["allocated"]
        ctx.replay_sources["verl"] = {"kind": "verl", "path": str(dp_file)}
    ctx.replay_sources["plain_into"] = {"kind": "plain_into", "path": str(plain_file)}
    return out


# -- replay ------------------------------------------------------------------------------------------


def bench_replay(ctx: Context) -> Dict[str, Any]:
    """Each source replayed in its own spawned process: first replay, warm repetitions, peak RSS."""
    out: Dict[str, Any] = {}
    for name, spec in ctx.replay_sources.items():
        ctx.progress(f"replay: {name} in a fresh process")
        result = replay_in_child({**spec, "reps": ctx.reps, "warm_bytes": 2 * ctx.payload_nbytes + (64 << 20),
                                  "cold_reps": min(3, ctx.reps)})
        out[name] = {
            **summarize(result["times_s"]),
            "cold_median_s": statistics.median(result["cold_times_s"]) if result["cold_times_s"] else None,
            "first_in_fresh_process_s": result["first_s"],
            "peak_rss_delta_bytes": result["peak_rss_delta_bytes"],
            "rss_method": result["rss_method"],
            "loaded_tensor_bytes": result["loaded_bytes"],
        }
    return out


# -- decisions with many recorded steps ---------------------------------------------------------------


def bench_lookup(ctx: Context) -> Dict[str, Any]:
    """`nearest` and `repeat` decide (and look up the record) with `lookup_steps` recorded steps.

    Steps 2, 4, ..., 2N are recorded. `nearest` is asked about random steps inside that range (odd ones
    miss and fall back to the largest earlier step, even ones hit); `repeat` about steps after it.
    """
    import torch

    from stepjournal import Journal
    from stepjournal.policies import CallContext, JournalView, Nearest, Repeat

    n = ctx.lookup_steps
    path = ctx.workdir / "lookup" / "journal"
    ctx.progress(f"lookup: recording {n} tiny steps (sync=False, setup only)")
    start = time.perf_counter()
    with Journal(path, sync=False, map_size=1 << 30) as journal:
        tiny = journal.prepare({"ids": torch.zeros(4, dtype=torch.int64)})
        for i in range(1, n + 1):
            journal.record(2 * i, tiny)
        run = journal.run
    setup_s = time.perf_counter() - start
    rng = random.Random(7)
    queries = {
        "nearest": [rng.randrange(1, 2 * n + 1) for _ in range(2000)],
        "repeat": [rng.randrange(2 * n + 1, 4 * n + 1) for _ in range(2000)],
    }
    policies = {"nearest": Nearest(), "repeat": Repeat()}
    out: Dict[str, Any] = {"recorded_steps": n, "setup_s": setup_s}
    for name, policy in policies.items():
        firsts = []
        for trial in range(max(3, ctx.reps)):
            with Journal(path, readonly=True) as journal:
                call = CallContext(run=run, step=queries[name][trial])
                firsts.append(timed(lambda: policy.decide(call, JournalView(journal))))
        with Journal(path, readonly=True) as journal:
            view = JournalView(journal)
            decision = policy.decide(CallContext(run=run, step=queries[name][0]), view)
            assert type(decision).__name__ == "ServeRecorded", decision
            per_call = []
            for step in queries[name]:
                call = CallContext(run=run, step=step)
                start = time.perf_counter()
                policy.decide(call, JournalView(journal))
                per_call.append(time.perf_counter() - start)
        out[name] = {
            "first_call_fresh_handle": summarize(firsts),
            "steady_state": {
                "median_s": statistics.median(per_call),
                "mean_s": statistics.fmean(per_call),
                "p99_s": sorted(per_call)[int(len(per_call) * 0.99) - 1],
                "decisions": len(per_call),
            },
        }
    return out


# -- verl SkipManager's folder scan --------------------------------------------------------------------

_GEN_BATCH = "gen_batch.dp"
_META = "meta.json"


def _step_dir_is_complete(path: Path) -> bool:
    # What verl 0.9.1 RolloutSkip._check_valid_step_path checks: the folder, the .dp file and meta.json.
    gen_batch, meta = path / _GEN_BATCH, path / _META
    return path.is_dir() and gen_batch.exists() and gen_batch.is_file() and meta.exists() and meta.is_file()


def verl_find_latest_step(project_dir: Path, step: int) -> int:
    """verl SkipManager's `repeat` lookup (RolloutSkip._find_latest_step), reimplemented from its reading.

    The exact step if its folder is complete; else list the project folder, keep the children whose name
    is an int and whose folder is complete, sort them, and take the largest smaller step, else the
    smallest larger one; -1 when none.
    """
    if _step_dir_is_complete(project_dir / str(step)):
        return step
    available: List[int] = []
    if project_dir.is_dir():
        for child in project_dir.iterdir():
            if not child.is_dir():
                continue
            try:
                found = int(child.name)
            except ValueError:
                continue
            if _step_dir_is_complete(child):
                available.append(found)
    available.sort()
    smaller = [s for s in available if s < step]
    if smaller:
        return smaller[-1]
    larger = [s for s in available if s > step]
    return larger[0] if larger else -1


def _verl_rollout_skip(dump_dir: Path, w: Workload):
    """verl's own RolloutSkip configured for this layout, or None when verl (or its API) is not there."""
    try:
        from omegaconf import OmegaConf
        from verl.utils.skip.config import RolloutSkipConfig
        from verl.utils.skip.rollout_skip import RolloutSkip
    except Exception:
        return None
    global_config = OmegaConf.create(
        {
            "trainer": {"experiment_name": "bench", "project_name": "stepjournal"},
            "actor_rollout_ref": {"rollout": {"n": w.group}},
            "data": {
                "train_batch_size": w.samples // w.group,
                "max_prompt_length": w.prompt_len,
                "max_response_length": w.response_len,
            },
        }
    )
    local = RolloutSkipConfig(enable=True, dump_dir=str(dump_dir), steps=[], action="repeat")
    try:
        return RolloutSkip(local, global_config)
    except Exception:
        return None


def bench_scan(ctx: Context) -> Dict[str, Any]:
    """verl SkipManager's `repeat` lookup over `scan_steps` dumped step folders (the same steps 2..2N)."""
    n, w = ctx.scan_steps, ctx.workload
    dump_dir = ctx.workdir / "verl-dump"
    project = dump_dir / "bench_stepjournal" / f"GBS{w.samples // w.group}_N{w.group}_in{w.prompt_len}_out{w.response_len}"
    ctx.progress(f"scan: creating {n} verl step folders (gen_batch.dp + meta.json each)")
    project.mkdir(parents=True)
    start = time.perf_counter()
    for i in range(1, n + 1):
        folder = project / str(2 * i)
        folder.mkdir()
        (folder / _GEN_BATCH).touch()  # the scan only checks that the file exists
        (folder / _META).write_text('{"global_steps": %d}' % (2 * i))  # written last: the completeness marker
    create_s = time.perf_counter() - start
    rng = random.Random(11)
    misses = [2 * rng.randrange(1, n) + 1 for _ in range(ctx.reps + 1)]  # odd: no exact folder, full scan
    reps = ctx.reps if n <= 20_000 else min(ctx.reps, 3)
    ctx.progress(f"scan: {reps} warm scans")
    assert verl_find_latest_step(project, misses[0]) == misses[0] - 1  # warms the dentry cache too
    scans = [timed(lambda s=s: verl_find_latest_step(project, s)) for s in misses[1 : reps + 1]]
    out: Dict[str, Any] = {"step_folders": n, "create_s": create_s, "reimplemented_scan": summarize(scans)}
    skip = _verl_rollout_skip(dump_dir, w) if ctx.verl_cross_check else None
    if skip is not None and Path(skip._get_project_dump_dir()) == project.resolve():
        ctx.progress("scan: cross-check with verl's own RolloutSkip._find_latest_step")
        assert skip._find_latest_step(misses[0]) == misses[0] - 1
        own = [timed(lambda s=s: skip._find_latest_step(s)) for s in misses[1 : min(reps, 2) + 1]]
        out["verl_rollout_skip_scan"] = summarize(own)
    ctx.progress(f"scan: removing {n} folders")
    start = time.perf_counter()
    shutil.rmtree(dump_dir)
    out["remove_s"] = time.perf_counter() - start
    return out


# -- passthrough -------------------------------------------------------------------------------------------


def bench_passthrough(ctx: Context) -> Dict[str, Any]:
    """Per-call cost of `journaled(fn, journal, "passthrough")` around a function that returns at once."""
    from stepjournal import Journal, journaled

    calls = 200 if ctx.reps >= 5 else 40
    out: Dict[str, Any] = {"calls": calls}

    def nothing() -> None:
        return None

    bare = []
    for _ in range(calls):
        start = time.perf_counter()
        nothing()
        bare.append(time.perf_counter() - start)
    out["bare_call_s"] = statistics.median(bare)
    for sync in (True, False):
        label = "durable" if sync else "sync_false"
        ctx.progress(f"passthrough: {calls} calls, {label}")
        with Journal(ctx.workdir / "passthrough" / label, sync=sync) as journal:
            wrapped = journaled(nothing, journal, "passthrough")
            for step in range(10):
                wrapped(step=step)
            per_call = []
            for step in range(10, 10 + calls):
                start = time.perf_counter()
                wrapped(step=step)
                per_call.append(time.perf_counter() - start)
        out[label] = {"median_s": statistics.median(per_call), "mean_s": statistics.fmean(per_call)}
    return out
