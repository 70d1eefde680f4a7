"""Shared pieces of the reliability tests (tests/integration/test_reliability_*.py).

- `report`: figures for docs/reliability.md, merged into the JSON file named by the environment
  variable ``STEPJOURNAL_RELIABILITY_REPORT`` (nothing is written when it is unset).
- `worker_context`: the multiprocessing context that starts the tests' child processes (see its docstring).
- `fuzz_worker`: a fuzz's worker run to its end, its JSON result read, or the case it died at named.
- `expected_output`: the deterministic rollout the writer children record, so the parent can check
  every byte that was served without keeping a copy.
"""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import platform
import signal
import time
from typing import Any, Callable, Tuple

import torch

REPORT_ENV = "STEPJOURNAL_RELIABILITY_REPORT"
_SERVER_ENV: "dict | None" = None  # the environment the forkserver of `worker_context` started with


def report(section: str, **figures: Any) -> None:
    """Merge `figures` under `section` of the reliability report, when one was asked for."""
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
        except (FileNotFoundError, json.JSONDecodeError):
            data = {}
        data.setdefault("machine", {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "torch": torch.__version__,
        })
        entry = dict(figures)
        entry["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        data.setdefault("sections", {})[section] = entry
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
        os.replace(tmp, path)


def worker_context(kind: str = "forkserver"):
    """The context that starts a test's child processes: a second writer or reader, a session that holds a
    run, the writers of the kill loops.

    ``spawn`` pays the import of torch (about 1.7 s of CPU) for every child; the kill loops start
    hundreds. ``forkserver`` starts one clean server process the way spawn does (no journal is ever
    open in it), imports the journal, `journaled`, the codec and torch there once (their modules: the
    package loads them lazily, the codec and torch at the first payload, so preloading the package
    alone would leave each child ~2 s of imports, and a kill loop's kills would all land before the
    first call), and forks each child from it: a child is as clean as a spawned one and costs
    milliseconds. It has the working folder and ``sys.path`` of the process that starts it, but the
    environment the server started with: when this process's environment has changed since (pytest's
    ``PYTEST_CURRENT_TEST`` aside), the context is ``spawn``. Its stdout and stderr too are the server's (the
    output captured for the test that started it): a test learns how a child ended from its exit status and
    what it sends back, and ``STEPJOURNAL_TEST_SPAWN=1`` makes every child a spawned one, whose traceback
    shows in its own test's output. The tests about spawn itself and the memory
    measurements (a child's peak RSS and address-space limit would hold the preloaded modules) use
    ``spawn`` themselves.
    """
    global _SERVER_ENV
    if kind == "forkserver" and os.environ.get("STEPJOURNAL_TEST_SPAWN", "") not in ("", "0"):
        kind = "spawn"
    if kind == "forkserver":
        here = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
        if _SERVER_ENV is None:
            _SERVER_ENV = here
        elif here != _SERVER_ENV:
            kind = "spawn"
    ctx = mp.get_context(kind)
    if kind == "forkserver":
        ctx.set_forkserver_preload(["torch", "stepjournal.payloads._codec", "stepjournal._journal", "stepjournal.adapters._raw",
                                    "reliability_workers"])
    return ctx


def fuzz_worker(target: Callable[..., None], args: Tuple[Any, ...], out: str, rebuild: str) -> dict:
    """Run `target(*args)` in a worker that writes its result to `out` as JSON (and the case it is on to
    ``<out>.case``, with an alarm per case); return the result, or fail the test naming the case it died at
    and `rebuild` (how to build that case again)."""
    import pytest

    proc = worker_context().Process(target=target, args=args)
    proc.start()
    proc.join(3600)  # a hang detector only: each case has its own alarm
    if proc.exitcode != 0:
        with open(out + ".case", encoding="ascii") as fh:
            case = fh.read()
        how = signal.Signals(-proc.exitcode).name if proc.exitcode < 0 else f"exit {proc.exitcode}"
        pytest.fail(f"the fuzz worker died ({how}; SIGALRM: a case ran past its alarm) at case {case}; {rebuild}")
    with open(out, encoding="utf-8") as fh:
        return json.load(fh)


# Payload sizes the writer children cycle through: small ones make many short commits, large ones
# make commits long enough that a random kill often lands inside LMDB's write and fsync, and the
# largest (over `FILE_FROM`, 8 MiB) is a payload file written before its event commits.
SIZES = (2_000, 40_000, 500_000, 2_000_000, 120_000, 1_000_000, 8_000, 9_000_000)


def expected_output(step: int, sizes: tuple = SIZES) -> dict:
    """The rollout a writer child produces at `step`: unique per step, cheap to make and to compare."""
    n = sizes[step % len(sizes)] // 8
    return {
        "step": step,
        "tokens": torch.arange(n, dtype=torch.int64) + step * 10_000_019,
        "text": f"completion of step {step}",
    }


def same_output(a: Any, b: Any) -> bool:
    return (
        isinstance(a, dict)
        and a.keys() == b.keys()
        and a["step"] == b["step"]
        and a["text"] == b["text"]
        and a["tokens"].dtype == b["tokens"].dtype
        and torch.equal(a["tokens"], b["tokens"])
    )
