"""Map growth under memory pressure: a map that cannot grow is a typed error, and the journal lives on.

LMDB grows its map by unmapping the old one and mapping a larger one; when the second mmap fails the
environment is left without a map. The child below caps its own address space (RLIMIT_AS) so that
the mmap really fails, then checks the error, the records made before, and that recording goes on.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import resource

import torch

from stepjournal import Journal
from stepjournal.errors import JournalFullError

MAP = 64 << 20
PAYLOAD_ELEMENTS = 512 << 10 >> 3  # 512 KiB of int64: under FILE_FROM, so each one goes into the map
RECORDS = 256  # 128 MiB in all: overflows the 64 MiB map


def _vm_size() -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))


def _value(step: int) -> dict:
    return {"step": step, "ids": torch.full((PAYLOAD_ELEMENTS,), step, dtype=torch.int64)}


def _grow_under_a_cap(path: str, out: str) -> None:
    """Process target: record until the map must grow past what the address-space cap allows."""
    result = {"recorded_before": 0, "error": None}
    journal = Journal(path, run="mem", map_size=MAP, sync=False)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    step = 0
    resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + (48 << 20), hard))  # room for the payloads, not a 128 MiB map
    try:
        for step in range(RECORDS):
            journal.record(step, _value(step))
            result["recorded_before"] += 1
    except JournalFullError as exc:
        result["error"] = ["JournalFullError", str(exc)]
    except BaseException as exc:  # the test reports what else came out
        result["error"] = [type(exc).__name__, str(exc)]
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    result["failed_step"] = step
    # The same handle, without the cap: earlier records intact, and recording goes on (the map grows now).
    result["earlier_intact"] = all(
        torch.equal(journal.load_output(journal.lookup(s))["ids"], _value(s)["ids"]) for s in range(step)
    )
    journal.record(step, _value(step))
    result["recorded_after"] = journal.step_count()
    result["problems"] = [p.detail for p in journal.verify()]
    journal.close()
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(result, fh)


def test_a_map_that_cannot_grow_for_lack_of_memory_raises_journal_full_and_the_handle_records_on(tmp_path):
    out = str(tmp_path / "out.json")
    proc = mp.get_context("spawn").Process(target=_grow_under_a_cap, args=(str(tmp_path / "journal"), out))
    proc.start()
    proc.join(300)
    assert proc.exitcode == 0, f"the child died ({proc.exitcode})"
    with open(out, encoding="utf-8") as fh:
        result = json.load(fh)
    assert result["error"] is not None and result["error"][0] == "JournalFullError", result
    assert "could not grow its memory map" in result["error"][1] and "stays usable" in result["error"][1]
    assert 10 <= result["recorded_before"] < RECORDS
    assert result["earlier_intact"]
    assert result["recorded_after"] == result["recorded_before"] + 1
    assert result["problems"] == []
