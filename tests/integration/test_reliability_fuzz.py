"""Hostile input: the payload and event decoders, fuzzed for a fixed budget under hard limits.

The fuzzing runs in a spawned child (tests/fuzz_targets.py) whose address space is capped at what it
had plus 1 GiB, with an audit hook watching for code execution, and a per-case deadline. Only typed
errors may come out of a decoder, none caused by running out of memory or recursion, and decoding
never runs code. ``make soak`` runs ten times the budget with a fresh seed, and atheris (libFuzzer).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from reliability_support import report, worker_context

HERE = Path(__file__).resolve().parent.parent


def fuzz(tmp_path, examples: int, seed: int, deadline_ms: int = 2000) -> dict:
    from fuzz_targets import run_fuzz

    out = str(tmp_path / "fuzz.json")
    proc = worker_context().Process(target=run_fuzz, args=(examples, seed, out, deadline_ms))
    proc.start()
    proc.join(3600)
    assert proc.exitcode == 0, f"the fuzzing child died ({proc.exitcode}): a crash or an unbounded allocation"
    with open(out, encoding="utf-8") as fh:
        result = json.load(fh)
    assert result["failure"] is None, f"seed {seed}: {result['failure']}"
    assert result["decoder_calls"] >= 6 * examples  # hypothesis cases, then as many plain-loop cases
    return result


def test_decoders_survive_a_fixed_fuzzing_budget_with_typed_errors_only(tmp_path):
    result = fuzz(tmp_path, examples=3000, seed=8)
    assert result["decoded"] > 0 and result["refused"] > 0  # both sides of the decoders were reached
    report("fuzz_hypothesis", **{k: result[k] for k in ("examples", "seed", "decoder_calls", "decoded", "refused",
                                                         "seconds", "max_rss_mb", "rss_growth_mb_plain_loop")},
           memory_cap="address space + 1 GiB", code_execution_events=0)


@pytest.mark.soak
def test_decoders_survive_a_long_fuzzing_run_with_typed_errors_only(tmp_path):
    seed = random.SystemRandom().randrange(1 << 31)
    result = fuzz(tmp_path, examples=100_000, seed=seed, deadline_ms=5000)
    report("fuzz_hypothesis_soak", **{k: result[k] for k in ("examples", "seed", "decoder_calls", "decoded",
                                                              "refused", "seconds", "max_rss_mb", "rss_growth_mb_plain_loop")},
           memory_cap="address space + 1 GiB", code_execution_events=0)


@pytest.mark.soak
def test_decoders_survive_atheris(tmp_path):
    """libFuzzer through atheris: coverage-guided, 2 GB RSS and 10 s per input limits."""
    from fuzz_targets import _valid_events, _valid_payloads

    runs = 1_000_000
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, data in enumerate(_valid_payloads() + _valid_events()):
        (corpus / f"seed{i}").write_bytes(data)
    done = subprocess.run(
        [sys.executable, str(HERE / "fuzz_targets.py"), "-atheris", f"-runs={runs}", "-rss_limit_mb=4096",
         "-malloc_limit_mb=2048", "-timeout=10", "-max_len=4096", f"-artifact_prefix={tmp_path}/", str(corpus)],
        capture_output=True, text=True, timeout=3600, cwd=str(HERE.parent),
        env={**os.environ, "PYTHONPATH": str(HERE)},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"Done {runs} runs" in done.stderr
    report("fuzz_atheris", runs=runs, crashes=0, limits="rss 4096 MB, malloc 2048 MB, 10 s per input")


def test_a_payload_cannot_name_code_to_run(tmp_path):
    """Ext nodes name registered codecs only; msgpack ext types, pickle opcodes and module paths are refused."""
    import pickle
    import struct

    import msgpack

    from stepjournal.errors import PayloadDecodeError, UnknownCodecError
    from stepjournal.payloads import decode_payload

    def framed(header_obj) -> bytes:
        header = msgpack.packb(header_obj, use_bin_type=True)
        body = struct.pack("<4sB3sQ", b"SJP\x01", 1, b"\0\0\0", len(header)) + header
        return body + b"\0" * (-len(body) % 64)

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))  # unpickling this creates the marker file

    evil = pickle.dumps(Evil())
    for header in ([8, "os.system", ["touch", str(marker)]], [8, "builtins.eval", "1+1"], [8, "pickle", b"\x80\x04."]):
        with pytest.raises(UnknownCodecError):
            decode_payload(framed(header))
    with pytest.raises(PayloadDecodeError):
        decode_payload(framed(msgpack.ExtType(1, b"code")))
    with pytest.raises(PayloadDecodeError):
        decode_payload(evil)
    with pytest.raises(PayloadDecodeError):
        decode_payload(b"SJP\x01\x01\0\0\0" + len(evil).to_bytes(8, "little") + evil)
    assert not marker.exists()


def test_an_event_with_bytes_keys_is_refused_with_a_typed_error():
    """Found by atheris: cattrs' error report failed on a bytes field name and let TypeError out."""
    import msgpack

    from stepjournal.errors import EventDecodeError
    from stepjournal.events._convert import decode_event  # private: raw event bytes, as stored

    fields = {"type": "call_bypassed", "v": 1, "session": "s", "run": "r", "step": 6, "gen_index": 0,
              "mode": "validate", "policy": "bypass", "reason": "val", "ts": [5.0]}
    for extra in ({b"<f4": b"32"}, {"fingerprint": {b"k": 1}}, {}):
        with pytest.raises(EventDecodeError):
            decode_event(msgpack.packb({**fields, **extra}, use_bin_type=True))


# -- hostile LMDB files ------------------------------------------------------------------------------
def lmdb_fuzz(tmp_path, cases: int, seed: int) -> dict:
    """Damaged data.mdb files in a spawned child: each is refused by the check or read whole by LMDB."""
    import shutil
    import signal

    from fuzz_targets import build_lmdb_seed, run_lmdb_fuzz

    build_lmdb_seed(str(tmp_path / "seed"))
    seed_file = str(tmp_path / "seed.mdb")
    shutil.copy(tmp_path / "seed" / "data.mdb", seed_file)
    out = str(tmp_path / "lmdb-fuzz.json")
    proc = worker_context().Process(target=run_lmdb_fuzz, args=(seed_file, seed, cases, str(tmp_path), out))
    proc.start()
    proc.join(3600)
    if proc.exitcode != 0:
        case = open(out + ".case", encoding="ascii").read()
        how = signal.Signals(-proc.exitcode).name if proc.exitcode < 0 else f"exit {proc.exitcode}"
        pytest.fail(f"a damaged data.mdb passed the check and killed the reader ({how}): seed {seed}, case {case}; "
                    "rebuild it with fuzz_targets.lmdb_case_bytes(seed_file, seed, case)")
    with open(out, encoding="utf-8") as fh:
        result = json.load(fh)
    assert result["cases"] == cases and result["refused"] > 0 and result["read"] > 0
    return result


def test_damaged_lmdb_files_are_refused_or_read_whole_never_a_crash(tmp_path):
    result = lmdb_fuzz(tmp_path, cases=400, seed=3)
    report("fuzz_lmdb_file", **result)


@pytest.mark.soak
def test_damaged_lmdb_files_soak(tmp_path):
    seed = random.SystemRandom().randrange(1 << 31)
    result = lmdb_fuzz(tmp_path, cases=50_000, seed=seed)
    report("fuzz_lmdb_file_soak", **result)
