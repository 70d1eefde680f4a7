"""The sharing fuzz's worker: damaged bundles and remotes verified, imported and pulled, under limits.

`run_cases` is a process target (spawn). It caps its address space (a blow-up is a `MemoryError`,
not a swapped machine), arms ``alarm`` before each case with the default action (a hang kills the
worker with SIGALRM; the parent reads the case it was on from ``<out>.case``), checks its peak RSS
after each case against `sharing_fuzz.rss_allowed` of the largest object read so far, and writes
its counts and its first failures (with the damaged input kept on disk) as JSON. A case is built
from `(seed, case)` alone, so the same run damages the same way.
"""

from __future__ import annotations

import io
import json
import os
import random
import resource
import shutil
import signal
import struct
import time
import traceback
import zipfile
from typing import Any, Dict, List

from sharing_fuzz import MIB, PER_CASE_S, mutate_objects, read_objects, read_remote, rss_allowed

_FIXED_TIME = (1980, 1, 1, 0, 0, 0)


def zip_bytes(objects: Dict[str, bytes], rng: random.Random) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name, data in objects.items():
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED if rng.random() < 0.01 else zipfile.ZIP_STORED
            archive.writestr(info, data)
    return out.getvalue()


_SPECIAL = [0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0xFFFFFFFF, 0x7FFFFFFF, 8, 14, 99, 0x800, 0x41, 0x21]
# (offset, width) of the fields of a local header (30 bytes), a central directory entry (46) and the end record (22).
_LOCAL = [(4, 2), (6, 2), (8, 2), (14, 4), (18, 4), (22, 4), (26, 2), (28, 2)]
_CENTRAL = [(4, 2), (6, 2), (8, 2), (10, 2), (16, 4), (20, 4), (24, 4), (28, 2), (30, 2), (32, 2), (34, 2),
            (38, 4), (42, 4)]
_END = [(4, 2), (6, 2), (8, 2), (10, 2), (12, 4), (16, 4), (20, 2)]


def mutate_zip(data: bytes, rng: random.Random) -> bytes:
    """A ZIP archive with a field of a local header, a central directory entry or the end record changed."""
    out = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        infos = archive.infolist()
    end = data.rfind(b"PK\x05\x06")
    central = struct.unpack_from("<I", data, end + 16)[0]
    for _ in range(rng.choice([1, 1, 2])):
        where = rng.randrange(5)
        if where == 0:
            base, fields = infos[rng.randrange(len(infos))].header_offset, _LOCAL
        elif where == 1:
            at, bases = central, []
            while out[at:at + 4] == b"PK\x01\x02" and len(bases) < len(infos):
                bases.append(at)
                at += 46 + sum(struct.unpack_from("<HHH", out, at + 28))
            base, fields = (rng.choice(bases) if bases else central), _CENTRAL
        elif where == 2:
            base, fields = end, _END
        elif where == 3:
            cut = rng.randrange(len(out))
            return bytes(out[:cut]) if rng.random() < 0.5 else bytes(out) + bytes(rng.randrange(256) for _ in range(40))
        else:
            out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
            continue
        offset, width = rng.choice(fields)
        value = rng.choice(_SPECIAL + [rng.getrandbits(8 * width)]) % (1 << (8 * width))
        if base + offset + width <= len(out):
            out[base + offset:base + offset + width] = value.to_bytes(width, "little")
    return bytes(out)


def make_case(seed_objects: Dict[str, bytes], seed: int, case: int) -> Dict[str, Any]:
    """The damaged input of one case: a bundle's bytes, or a remote's objects."""
    rng = random.Random(seed * 1_000_003 + case)
    if rng.random() < 0.5:
        objects = mutate_objects(seed_objects, rng) if rng.random() < 0.7 else dict(seed_objects)
        data = zip_bytes(objects, rng)
        if rng.random() < 0.4 or objects == seed_objects:
            data = mutate_zip(data, rng)
        return {"kind": "bundle", "data": data, "largest": len(data)}
    objects = mutate_objects(seed_objects, rng)
    return {"kind": "remote", "objects": objects, "largest": max(map(len, objects.values()), default=0)}


def _fresh_journal(path: str) -> Any:
    from stepjournal import Journal

    return Journal(path, session=False, sync=False, map_size=16 * MIB)


def run_case(work: str, made: Dict[str, Any], counts: Dict[str, int]) -> None:
    """Verify and import a damaged bundle, or pull a damaged remote, each into a fresh journal."""
    from stepjournal.errors import StepJournalError
    from stepjournal.sharing import import_bundle, pull, verify_bundle

    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    if made["kind"] == "bundle":
        path = os.path.join(work, "case.sjbundle")
        with open(path, "wb") as fh:
            fh.write(made["data"])
        steps = [("verify", lambda: verify_bundle(path))]
        source = lambda journal: import_bundle(path, journal)  # noqa: E731
    else:
        folder = os.path.join(work, "remote")
        for name, data in made["objects"].items():
            os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
            with open(os.path.join(folder, name), "wb") as fh:
                fh.write(data)
        steps = []
        source = lambda journal: pull(f"file://{folder}", journal)  # noqa: E731
    journal = _fresh_journal(os.path.join(work, "journal"))
    try:
        steps.append(("import", lambda: source(journal)))
        for what, step in steps:
            ended = "ok"
            try:
                step()
                counts[f"{what}_ok"] += 1
            except StepJournalError as exc:
                ended = "refused"
                cause = exc.__cause__ or exc.__context__
                if isinstance(cause, (MemoryError, RecursionError)):
                    raise AssertionError(f"{what}: a typed error caused by {type(cause).__name__}: {exc}") from exc
                counts[f"{what}_refused"] += 1
        if journal.last_seq():  # what was imported reads back as a journal; does it verify clean?
            counts[f"verify_problems_after_import_{ended}"] += bool(journal.verify())
    finally:
        journal.close()


def _limit_memory(extra: int) -> None:
    with open("/proc/self/status", encoding="ascii") as fh:
        size = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    resource.setrlimit(resource.RLIMIT_AS, (size + extra, size + extra))


def _status(field: str) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith(field + ":"))


def _max_rss() -> int:
    """This process's peak RSS: ``VmHWM``, not ``ru_maxrss`` (which a spawned child inherits from the
    parent it was forked from before its exec: the pytest process, with torch loaded)."""
    return _status("VmHWM")


def run_cases(bundle: str, seed: int, first: int, cases: int, work: str, out: str) -> None:
    """Process target: cases `first` .. `first + cases - 1` of `seed`; JSON counts to `out`."""
    import stepjournal  # noqa: F401 - its imports are not the cases' memory

    seed_objects = read_objects(bundle)
    remote_objects = read_remote(os.path.join(os.path.dirname(bundle), "seed-remote"))
    counts = {k: 0 for k in ("cases", "bundles", "remotes", "verify_ok", "verify_refused", "import_ok", "import_refused",
                             "verify_problems_after_import_ok", "verify_problems_after_import_refused")}
    failures: List[Dict[str, Any]] = []
    run_case(os.path.join(work, "warm"), {"kind": "bundle", "data": open(bundle, "rb").read()}, dict.fromkeys(counts, 0))
    _limit_memory(3 << 30)
    baseline, largest, worst = _max_rss(), 0, 0
    started = time.monotonic()
    for case in range(first, first + cases):
        with open(out + ".case", "w", encoding="ascii") as fh:
            fh.write(str(case))
        rng_pick = random.Random(seed * 7 + case).random()
        made = make_case(remote_objects if rng_pick < 0.3 else seed_objects, seed, case)
        largest = max(largest, made["largest"])
        signal.alarm(PER_CASE_S)
        try:
            run_case(os.path.join(work, "case"), made, counts)
        except BaseException as exc:  # the parent reports it
            keep = os.path.join(work, f"failed-{case}")
            shutil.copytree(os.path.join(work, "case"), keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("journal"))
            failures.append({"case": case, "kind": made["kind"], "kept": keep,
                             "error": "".join(traceback.format_exception(exc))[-3000:]})
        finally:
            signal.alarm(0)
        counts["cases"] += 1
        counts[made["kind"] + "s"] += 1
        worst = max(worst, _max_rss() - baseline)
        if worst > rss_allowed(largest):
            failures.append({"case": case, "error": f"peak RSS grew {worst >> 20} MiB, over the "
                             f"{rss_allowed(largest) >> 20} MiB allowed for objects of {largest} bytes"})
            break
        if len(failures) >= 5:
            break
    result = {"seed": seed, "first": first, **counts, "failures": failures, "seconds": round(time.monotonic() - started, 1),
              "rss_growth_mb": worst >> 20, "rss_allowed_mb": rss_allowed(largest) >> 20, "largest_object": largest}
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(result, fh)


def measure_child(kind: str, where: str, journal: str, out: str) -> None:
    """Process target (spawn; this module imports no torch): peak RSS over the RSS before one
    `verify_bundle`, `import_bundle` or `pull` of `where`, and how it ended, as JSON to `out`."""
    from stepjournal import Journal
    from stepjournal.errors import StepJournalError
    from stepjournal.sharing import import_bundle, pull, verify_bundle

    opened = Journal(journal, session=False, sync=False)
    with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
        fh.write("5")  # the peak RSS starts again from the RSS now
    before = _status("VmRSS")
    try:
        if kind == "verify":
            outcome = f"{len(verify_bundle(where)[1])} problems"
        elif kind == "import":
            outcome = f"{import_bundle(where, opened).events_pulled} events"
        else:
            outcome = f"{pull(where, opened).events_pulled} events"
    except StepJournalError as exc:
        outcome = type(exc).__name__
    growth = _max_rss() - before
    opened.close()
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"growth": growth, "outcome": outcome}, fh)
