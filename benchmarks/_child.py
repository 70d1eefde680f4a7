"""Replays measured in a spawned child: a fresh process, with the data in the page cache.

Peak RSS is read from the kernel's per-address-space high-water mark (``VmHWM``), reset just before
the replay, because ``ru_maxrss`` in a spawned child starts at the parent's peak: exec carries the
parent's high-water mark over into the child's accounting. Where /proc is missing the child falls back
to ``ru_maxrss`` minus its value after imports.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import time
from typing import Any, Dict

__all__ = ["peak_reset", "replay_in_child", "status_bytes"]


def status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def peak_reset() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return status_bytes("VmHWM") is not None
    except OSError:
        return False


def _tensor_bytes(value: Any) -> int:
    import numpy as np
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, np.ndarray) and value.dtype != object:
        return value.nbytes
    batch = getattr(value, "batch", None)  # verl DataProto: a TensorDict of tensors
    if batch is not None:
        return sum(_tensor_bytes(batch[k]) for k in batch.keys())
    return 0


def _child(spec: Dict[str, Any]) -> Dict[str, Any]:
    from ._measure import evict_from_page_cache, maxrss_bytes, quiet_logs

    quiet_logs()
    import numpy  # imported before the baseline: imports are not part of a replay
    import torch  # noqa: F401

    kind, path = spec["kind"], spec["path"]
    if kind == "journal":
        from stepjournal import Journal

        if spec.get("dataproto"):
            import stepjournal.adapters.verl  # noqa: F401  (registers the DataProto codec)
        step = spec["step"]

        def op():
            # A fresh handle each time: its own LMDB environment and map of the file.
            with Journal(path, readonly=True) as journal:
                return journal.load_output(journal.lookup(step))

    elif kind == "verl":
        from verl.protocol import DataProto

        def op():
            return DataProto.load_from_disk(path)

    elif kind == "plain":

        def op():
            with open(path, "rb") as f:
                return f.read()

    elif kind == "plain_into":
        # The strictest file baseline: read straight into numpy-allocated memory, one copy.
        import numpy as np

        size = os.path.getsize(path)

        def op():
            out = np.empty(size, dtype=np.uint8)
            with open(path, "rb", buffering=0) as f:
                f.readinto(out)
            return out

    else:  # pragma: no cover - programming error
        raise ValueError(kind)

    warm = spec.get("warm_bytes", 0)

    def prime() -> None:  # see _measure.settle: every replay finds the same warm free memory
        if warm:
            scratch = numpy.ones(warm, dtype=numpy.uint8)
            del scratch

    prime()
    gc.collect()
    rusage_base = maxrss_bytes()
    exact = peak_reset()
    rss_before = status_bytes("VmRSS") if exact else rusage_base
    start = time.perf_counter()
    value = op()
    first = time.perf_counter() - start
    peak = (status_bytes("VmHWM") if exact else maxrss_bytes()) or 0
    loaded = _tensor_bytes(value)
    del value
    gc.collect()

    def timed(evict: bool) -> float:
        if evict:
            for name in _files_under(path):
                evict_from_page_cache(name)
        prime()
        start = time.perf_counter()
        value = op()
        seconds = time.perf_counter() - start
        del value
        gc.collect()
        return seconds

    times = [timed(False) for _ in range(spec["reps"])]
    # Cold: every file of the source dropped from the page cache first (a journal: data.mdb and each
    # payload file), as after a reboot; reported beside the warm figure, not in its place.
    cold = [timed(True) for _ in range(spec.get("cold_reps", 0))]
    return {
        "first_s": first,
        "times_s": times,
        "cold_times_s": cold,
        "peak_rss_delta_bytes": max(0, peak - (rss_before or 0)),
        "rss_method": "VmHWM" if exact else "ru_maxrss",
        "loaded_bytes": loaded,
    }


def _files_under(path: str) -> list:
    if not os.path.isdir(path):
        return [path]
    return [os.path.join(folder, name) for folder, _, names in os.walk(path) for name in names
            if name != "lock.mdb"]


def replay_in_child(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Run one replay kind (`journal`, `verl`, `plain`, `plain_into`) in a spawned process.

    Args:
        spec: ``kind``, ``path``, ``reps``, ``warm_bytes`` (see `_measure.settle`), ``cold_reps``
            (replays after dropping the source's files from the page cache); for journals also ``step``
            and ``dataproto``.

    Returns:
        ``first_s`` (first replay in the fresh process), ``times_s`` (the warm repetitions, each with a
        fresh handle), ``cold_times_s``, ``peak_rss_delta_bytes`` of the first replay, and ``loaded_bytes``.
    """
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_child, (spec,))
