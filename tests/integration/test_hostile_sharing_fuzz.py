"""Hostile input on the sharing side: damaged real bundles and remotes, fuzzed under time and memory bounds.

`tests/sharing_fuzz.py` damages a real bundle's and a real ``file://`` remote's objects knowing their
structure (ZIP headers, JSON documents, msgpack segments with digests recomputed or stale, events
encoded with the journal's own encoder, ``released`` lists); `tests/sharing_fuzz_run.py` verifies,
imports and pulls each into a fresh journal in a spawned worker with its address space capped, an
alarm per case (a hang kills it; the parent names the case) and its peak RSS checked after each case.
Only success or a `StepJournalError` subclass may come out. ``make soak`` runs 20 000 cases with a
fresh seed.
"""

from __future__ import annotations

import json
import random
import signal

import pytest

from reliability_support import report, worker_context


def sharing_fuzz(tmp_path, cases: int, seed: int) -> dict:
    from sharing_fuzz import build_seed
    from sharing_fuzz_run import run_cases

    bundle, _remote = build_seed(str(tmp_path))
    out = str(tmp_path / "sharing-fuzz.json")
    proc = worker_context().Process(target=run_cases, args=(bundle, seed, 0, cases, str(tmp_path), out))
    proc.start()
    proc.join(7200)  # a hang detector only: each case has its own alarm
    if proc.exitcode != 0:
        case = open(out + ".case", encoding="ascii").read()
        how = signal.Signals(-proc.exitcode).name if proc.exitcode < 0 else f"exit {proc.exitcode}"
        pytest.fail(f"the sharing fuzz worker died ({how}; SIGALRM: a case ran past its alarm) at seed {seed}, "
                    f"case {case}; rebuild it with sharing_fuzz_run.make_case")
    with open(out, encoding="utf-8") as fh:
        result = json.load(fh)
    assert result["failures"] == [], f"seed {seed}: {result['failures']}"
    assert result["cases"] == cases
    return result


def test_damaged_bundles_and_remotes_end_in_success_or_a_typed_error(tmp_path):
    result = sharing_fuzz(tmp_path, cases=300, seed=27)
    # Both sides of verify, import and pull were reached, and hostile input really was refused.
    assert result["import_refused"] > 0 and result["import_ok"] > 0 and result["verify_refused"] > 0
    assert result["bundles"] > 0 and result["remotes"] > 0
    assert result["rss_growth_mb"] <= result["rss_allowed_mb"]
    report("fuzz_sharing", **{k: v for k, v in result.items() if k != "failures"}, untyped_errors=0, hangs=0)


@pytest.mark.soak
def test_damaged_bundles_and_remotes_soak(tmp_path):
    seed = random.SystemRandom().randrange(1 << 31)
    result = sharing_fuzz(tmp_path, cases=20_000, seed=seed)
    report("fuzz_sharing_soak", **{k: v for k, v in result.items() if k != "failures"}, untyped_errors=0, hangs=0)
