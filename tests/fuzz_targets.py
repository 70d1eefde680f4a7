"""Fuzz targets for the payload and event decoders, run in a child process with hard limits.

`run_fuzz` is a process target: it caps the child's address space (a lying length field that makes
a decoder allocate gigabytes then fails with MemoryError instead of swapping the machine), installs
an audit hook that notes any attempt to run code (exec, compile, import, pickle, os.system,
subprocess ...) while a decoder runs, and drives hypothesis with a fixed budget and a per-case
deadline. What may escape a decoder: `StepJournalError` subclasses only, never caused by a
MemoryError or RecursionError. The child writes its figures, or the first failure, as JSON.

Also runnable under atheris (libFuzzer): ``python tests/fuzz_targets.py -atheris -runs=N``.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
import time
from datetime import timedelta

import msgpack

# Decoder calls made and their outcomes, across targets.
COUNTS = {"payload": 0, "event": 0, "describe": 0, "decoded": 0, "refused": 0}
_WATCH = {"on": False, "events": []}
_CODE_EVENTS = (
    "exec", "compile", "import", "pickle.find_class", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
    "os.fork", "subprocess.Popen", "ctypes.dlopen", "builtins.input", "socket.connect", "marshal.loads",
)


def _audit(event: str, args) -> None:
    if _WATCH["on"] and event.startswith(_CODE_EVENTS):
        _WATCH["events"].append(f"{event} {str(args)[:200]}")


def _valid_payloads() -> list:
    import numpy as np
    import torch

    from stepjournal.payloads import encode_payload

    values = [
        {"ids": torch.arange(12, dtype=torch.int64).reshape(3, 4), "logp": torch.randn(3, 4), "uid": ["a", "b"]},
        [1, 2.5, None, True, b"bytes", "text", (1, 2), {"k": (3, 4)}, 1 << 70],
        np.arange(10, dtype=">i4"),
        {"obj": np.array([{"x": 1}, [2]], dtype=object), "s": np.float32(1.5), "bf": torch.ones(3, dtype=torch.bfloat16)},
        torch.zeros(0, 5),
    ]
    return [bytes(encode_payload(v)) for v in values]


def _valid_events() -> list:
    from stepjournal.events import (
        CallBypassed,
        CallRefused,
        GenerationRecorded,
        PayloadRef,
        ReplayServed,
        SessionOpened,
    )
    from stepjournal.events._convert import encode_event  # private: raw event bytes, as stored

    ref = PayloadRef(digest="ab" * 32, nbytes=100, stored_nbytes=90, compression="zstd")
    events = [
        SessionOpened(session="s", run="r", fingerprint={"a": 1, "b": "x", "c": None, "d": 1.5, "e": True},
                      library_version="0", host="h", pid=1, ts=1.0),
        GenerationRecorded(session="s", run="r", step=3, gen_index=1, mode="train", input_digest="cd" * 32,
                           output=ref, input=ref, duration_s=0.5, policy="cache", reason="why", ts=2.0,
                           imported_from=None),
        CallRefused(session="s", run="r", step=4, gen_index=0, mode="train", policy="replay", reason="no", ts=3.0),
        ReplayServed(session="s", run="r", step=5, gen_index=0, mode="train", input_digest=None, source_seq=2,
                     source_run="r", source_step=3, source_gen_index=1, output=ref, policy="cache", reason="hit",
                     ts=4.0),
        CallBypassed(session="s", run="r", step=6, gen_index=0, mode="validate", policy="bypass", reason="val",
                     ts=5.0),
    ]
    return [encode_event(e) for e in events]


def _check_escape(exc: BaseException, allowed) -> None:
    if not isinstance(exc, allowed):
        raise AssertionError(f"untyped error escaped a decoder: {type(exc).__module__}.{type(exc).__name__}: {exc}")
    cause = exc.__cause__ or exc.__context__
    while cause is not None:
        if isinstance(cause, (MemoryError, RecursionError)):
            raise AssertionError(f"a decoder ran out of {type(cause).__name__} behind {type(exc).__name__}: {exc}")
        cause = cause.__cause__ or cause.__context__


def _call(kind: str, fn, data: bytes) -> None:
    from stepjournal.errors import StepJournalError

    COUNTS[kind] += 1
    _WATCH["on"] = True
    try:
        fn(data)
        COUNTS["decoded"] += 1
    except StepJournalError as exc:
        _check_escape(exc, StepJournalError)
        COUNTS["refused"] += 1
    except BaseException as exc:
        _check_escape(exc, StepJournalError)
    finally:
        _WATCH["on"] = False
    if _WATCH["events"]:
        raise AssertionError(f"decoding ran code: {_WATCH['events'][:5]}")


def _mutations():
    """A hypothesis strategy of byte strings: random, and valid encodings changed in several ways."""
    from hypothesis import strategies as st

    payloads, events = _valid_payloads(), _valid_events()
    valid = payloads + events

    huge = st.sampled_from([0xFFFFFFFF, 0x7FFFFFFF, 1 << 40, (1 << 63) - 1, (1 << 64) - 1, 0x80000000])

    @st.composite
    def mutated(draw):
        data = bytearray(draw(st.sampled_from(valid)))
        for _ in range(draw(st.integers(1, 4))):
            how = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "length", "splice"]))
            i = draw(st.integers(0, max(0, len(data) - 1)))
            if how == "flip" and data:
                data[i] ^= 1 << draw(st.integers(0, 7))
            elif how == "set" and data:
                data[i] = draw(st.integers(0, 255))
            elif how == "insert":
                data[i:i] = draw(st.binary(min_size=1, max_size=16))
            elif how == "delete" and data:
                del data[i : i + draw(st.integers(1, 16))]
            elif how == "truncate":
                del data[i:]
            elif how == "length" and len(data) >= i + 9:
                # Overwrite 4 or 8 bytes with a lying length (msgpack str32/bin32/array32 headers,
                # the payload's u64 header length ...).
                width = draw(st.sampled_from([4, 8]))
                value = draw(huge) & ((1 << (8 * width)) - 1)
                order = draw(st.sampled_from(["<", ">"]))
                data[i : i + width] = value.to_bytes(width, "little" if order == "<" else "big")
            elif how == "splice":
                other = draw(st.sampled_from(valid))
                j = draw(st.integers(0, len(other)))
                data[i:] = other[j:]
        return bytes(data)

    @st.composite
    def payload_headers(draw):
        """A well-framed payload whose msgpack header tree is random: the decoder's semantic checks."""
        leaf = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1), st.floats(),
                         st.text(max_size=20), st.binary(max_size=20),
                         st.sampled_from(["torch.float32", "<i8", "|b1", "<M8[ns]", "torch.bfloat16", "x"]))
        node = st.recursive(
            leaf,
            lambda inner: st.one_of(
                st.lists(inner, max_size=6).map(lambda xs: [0] + xs),
                st.tuples(st.integers(0, 9), st.lists(inner, max_size=5)).map(lambda t: [t[0]] + t[1]),
                st.tuples(st.sampled_from([4, 5]), leaf, st.lists(st.integers(0, 1 << 40), max_size=4), huge, huge)
                .map(list),
            ),
            max_leaves=30,
        )
        header = msgpack.packb(draw(node), use_bin_type=True)
        data = draw(st.binary(max_size=256))
        prefix = struct.pack("<4sB3sQ", b"SJP\x01", 1, b"\0\0\0", len(header))
        body = prefix + header
        return body + b"\0" * (-len(body) % 64) + data

    @st.composite
    def event_maps(draw):
        keys = st.sampled_from(["type", "v", "session", "run", "step", "gen_index", "mode", "output", "input",
                                "reason", "ts", "fingerprint", "crc32", "policy", "digest", "nbytes", "x"])
        value = st.one_of(st.none(), st.booleans(), st.integers(-(1 << 63), (1 << 64) - 1), st.floats(),
                          st.text(max_size=30), st.binary(max_size=30),
                          st.sampled_from(["generation_recorded", "session_opened", "call_refused"]),
                          st.dictionaries(st.text(max_size=8), st.integers(-(1 << 63), (1 << 64) - 1), max_size=4))
        keys = st.one_of(keys, keys, st.binary(max_size=6))  # msgpack allows bytes keys; events do not
        value = st.one_of(value, st.dictionaries(st.binary(max_size=4), st.integers(0, 9), max_size=2))
        return msgpack.packb(draw(st.dictionaries(keys, value, max_size=12)), use_bin_type=True)

    return st.one_of(st.binary(max_size=2048), mutated(), payload_headers(), event_maps())


def fuzz_with_hypothesis(examples: int, seed: int, deadline_ms: int) -> None:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as fixed_seed

    from stepjournal.payloads import decode_payload, describe_payload
    from stepjournal.events._convert import decode_event  # private: raw event bytes, as stored

    @fixed_seed(seed)
    @settings(max_examples=examples, deadline=timedelta(milliseconds=deadline_ms), database=None,
              suppress_health_check=list(HealthCheck), derandomize=False)
    @given(_mutations())
    def target(data: bytes) -> None:
        _call("payload", decode_payload, data)
        _call("describe", describe_payload, data)
        _call("event", decode_event, data)

    target()


def _rss_mb() -> int:
    with open("/proc/self/statm", encoding="ascii") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // (1 << 20)


def _leak_check(cases: int, seed: int) -> int:
    """Decode `cases` randomly damaged valid encodings without hypothesis; return the RSS growth in MB.

    Hypothesis keeps data about what it ran; this loop keeps nothing, so growth here would be the
    decoders' own.
    """
    import gc
    import random

    from stepjournal.payloads import decode_payload, describe_payload
    from stepjournal.events._convert import decode_event  # private: raw event bytes, as stored

    seeds = _valid_payloads() + _valid_events()
    rng = random.Random(seed)
    gc.collect()
    before = _rss_mb()
    for _ in range(cases):
        data = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(data))
            data[i] = rng.randrange(256)
        for kind, fn in (("payload", decode_payload), ("describe", describe_payload), ("event", decode_event)):
            _call(kind, fn, bytes(data))
    gc.collect()
    grown = _rss_mb() - before
    if grown > 64:
        raise AssertionError(f"decoding {cases} damaged inputs grew the process by {grown} MB")
    return grown


def _limit_memory(extra_bytes: int) -> int:
    with open("/proc/self/status", encoding="ascii") as fh:
        vm = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))
    limit = vm + extra_bytes
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    return limit


def run_fuzz(examples: int, seed: int, out_path: str, deadline_ms: int = 2000, extra_memory: int = 1 << 30) -> None:
    """Process target: fuzz with hypothesis under a memory cap and an audit hook; write JSON to out_path."""
    import stepjournal.payloads  # imported before the hook and the cap: its imports are not findings

    from stepjournal.events._convert import decode_event  # private: raw event bytes, as stored

    # Warm up before watching: numpy and torch import some dtype support lazily, and cattrs compiles
    # its structuring function for each event class on first use (from our classes, never from input).
    for data in _valid_payloads():
        stepjournal.payloads.decode_payload(data)
    for data in _valid_events():
        decode_event(data)
    sys.addaudithook(_audit)
    started = time.monotonic()
    limit = _limit_memory(extra_memory)
    result = {"examples": examples, "seed": seed, "address_space_limit": limit}
    try:
        fuzz_with_hypothesis(examples, seed, deadline_ms)
        result["failure"] = None
    except BaseException as exc:  # the parent reports it
        parts = list(exc.exceptions) if isinstance(exc, BaseExceptionGroup) else [exc]
        result["failure"] = " | ".join(f"{type(e).__name__}: {e} {getattr(e, '__notes__', '')}" for e in parts)[:6000]
    if result["failure"] is None:
        try:
            result["rss_growth_mb_plain_loop"] = _leak_check(examples, seed)
        except BaseException as exc:
            result["failure"] = f"plain loop: {type(exc).__name__}: {exc}"[:4000]
    result.update(COUNTS)
    result["decoder_calls"] = COUNTS["payload"] + COUNTS["event"] + COUNTS["describe"]
    result["seconds"] = round(time.monotonic() - started, 1)
    result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)


# -- atheris --------------------------------------------------------------------------------------------
def _atheris_main(argv: list) -> None:  # pragma: no cover - run by the soak test in a subprocess
    import atheris

    with atheris.instrument_imports(include=["stepjournal"]):
        from stepjournal.errors import StepJournalError
        from stepjournal.payloads import decode_payload, describe_payload
        from stepjournal.events._convert import decode_event  # private: raw event bytes, as stored

    seeds = _valid_payloads() + _valid_events()

    def one(data: bytes) -> None:
        if data and data[0] < 64:  # a quarter of the inputs start from a valid encoding
            base = seeds[data[0] % len(seeds)]
            data = base[: len(base) // 2] + data[1:] + base[len(base) // 2 :]
        for fn in (decode_payload, describe_payload, decode_event):
            try:
                fn(data)
            except StepJournalError as exc:
                _check_escape(exc, StepJournalError)

    atheris.Setup(argv, one)
    atheris.Fuzz()


if __name__ == "__main__":  # pragma: no cover
    if "-atheris" in sys.argv:
        sys.argv.remove("-atheris")
        _atheris_main(sys.argv)
    else:
        sys.exit("usage: python tests/fuzz_targets.py -atheris [libFuzzer flags]")


# -- LMDB files (hostile data.mdb) ---------------------------------------------------------------------
# A crafted data.mdb must never crash the reader: stepjournal walks its trees (journal/storage/_lmdb_check.py)
# before LMDB reads them. Each case damages a real journal's file in a structure-aware way, then runs the
# check; a file the check lets through is read completely with py-lmdb alone, every value of every
# database touched. A signal (SIGBUS, SIGSEGV, an LMDB assertion) kills the child: the parent reports
# the seed and the case number, and `lmdb_case_bytes(seed_file, seed, case)` rebuilds the file.
LMDB_COUNTS = {"cases": 0, "refused": 0, "read": 0, "lmdb_error": 0}


def build_lmdb_seed(path: str) -> None:
    """A small journal with a two-level events tree, overflow payloads and inline ones."""
    import torch

    from stepjournal import Journal

    with Journal(path, run="fuzz", fingerprint={"model": "m"}, sync=False, map_size=8 << 20) as journal:
        for step in range(120):
            journal.record(step, {"ids": torch.full((600 if step % 3 else 4,), step)}, input={"p": step})
        journal.record_bypass(1)


def _mutate_lmdb(data: bytes, rng) -> bytes:
    import struct

    out = bytearray(data)
    psize = struct.unpack_from("<I", out, 16 + 24)[0]
    pages = len(out) // psize
    for _ in range(rng.randint(1, 3)):
        how = rng.choice(["byte", "u16", "u32", "u64", "node_size", "pointer", "meta", "truncate", "copy_page"])
        page = rng.randrange(pages)
        base = page * psize
        if how == "byte":
            out[base + rng.randrange(psize)] ^= 1 << rng.randrange(8)
        elif how in ("u16", "u32", "u64"):
            width = {"u16": 2, "u32": 4, "u64": 8}[how]
            at = base + rng.randrange(0, psize - width, 2)
            value = rng.choice([0, 1, 2, pages - 1, pages, pages + 1, (1 << (8 * width)) - 1, rng.getrandbits(8 * width)])
            out[at:at + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
        elif how in ("node_size", "pointer"):
            # A node of this page, as LMDB lays it out: lo, hi (size, or child page), flags, key size.
            lower = struct.unpack_from("<H", out, base + 12)[0]
            count = max(0, min((lower - 16) // 2, (psize - 16) // 2))
            if count:
                ptr = struct.unpack_from("<H", out, base + 16 + 2 * rng.randrange(count))[0]
                if ptr + 8 <= psize:
                    size = rng.choice([1 << 28, 1 << 31, (1 << 32) - 1, psize * rng.randrange(1, 64), rng.getrandbits(32)])
                    if how == "pointer":
                        size = rng.choice([pages, pages + 5, page, 0, 1, rng.randrange(pages)])
                        out[base + ptr + 4:base + ptr + 6] = (size >> 32 & 0xFFFF).to_bytes(2, "little")
                    out[base + ptr:base + ptr + 4] = struct.pack("<HH", size & 0xFFFF, size >> 16 & 0xFFFF)
        elif how == "meta":
            meta = rng.choice([0, psize]) + 16
            field = rng.choice([16, 24 + 6, 24 + 40, 72 + 6, 72 + 40, 120, 128])  # mapsize, depths, roots, last page, txnid
            value = rng.choice([0, 1, pages - 1, pages, pages + 3, 1 << 40, (1 << 64) - 1, rng.getrandbits(32)])
            width = 2 if field in (30, 78) else 8
            out[meta + field:meta + field + width] = (value % (1 << (8 * width))).to_bytes(width, "little")
        elif how == "truncate":
            del out[rng.randrange(2 * psize, len(out)):]
            pages = len(out) // psize
        elif how == "copy_page" and pages > 3:
            source = rng.randrange(2, pages) * psize
            out[base:base + psize] = out[source:source + psize]
        if pages < 3:
            break
    return bytes(out)


def lmdb_case_bytes(seed_file: str, seed: int, case: int) -> bytes:
    import random

    with open(seed_file, "rb") as fh:
        data = fh.read()
    return _mutate_lmdb(data, random.Random(seed * 1_000_003 + case))


def _read_everything_with_lmdb(folder: str) -> None:
    import lmdb

    env = lmdb.open(folder, max_dbs=16, readonly=True, lock=False, subdir=True)
    try:
        with env.begin(buffers=True) as txn:
            names = [bytes(k) for k, _ in txn.cursor()]
            total = 0
            for name in names:
                try:
                    db = env.open_db(name, txn=txn, create=False)
                except lmdb.Error:
                    continue
                for key, value in txn.cursor(db=db):
                    total += len(bytes(key)) + sum(bytes(value)[:: 4096])  # touch every page of the value
    finally:
        env.close()


def lmdb_case(folder: str, data: bytes) -> str:
    """Write `data` as the folder's data.mdb, check it, and read all of it with LMDB when the check passes."""
    import lmdb

    from stepjournal.errors import IntegrityError
    from stepjournal.storage._lmdb_check import check_data_file  # private: the LMDB file checks under test

    with open(os.path.join(folder, "data.mdb"), "wb") as fh:
        fh.write(data)
    LMDB_COUNTS["cases"] += 1
    try:
        check_data_file(os.path.join(folder, "data.mdb"))
    except IntegrityError:
        LMDB_COUNTS["refused"] += 1
        return "refused"
    try:
        _read_everything_with_lmdb(folder)
    except lmdb.Error:
        LMDB_COUNTS["lmdb_error"] += 1  # LMDB noticed by itself; a typed error in stepjournal
        return "lmdb_error"
    LMDB_COUNTS["read"] += 1
    return "read"


def run_lmdb_fuzz(seed_file: str, seed: int, cases: int, work: str, out_path: str) -> None:
    """Process target: `cases` damaged files; the case in progress is kept in out_path + '.case'."""
    started = time.monotonic()
    with open(seed_file, "rb") as fh:
        original = fh.read()
    folder = os.path.join(work, "journal")
    os.makedirs(folder, exist_ok=True)
    import random

    for case in range(cases):
        with open(out_path + ".case", "w", encoding="ascii") as fh:
            fh.write(str(case))
        lmdb_case(folder, _mutate_lmdb(original, random.Random(seed * 1_000_003 + case)))
    result = {"seed": seed, **LMDB_COUNTS, "seconds": round(time.monotonic() - started, 1)}
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
