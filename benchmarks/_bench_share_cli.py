"""Sharing through the command line as typed: ``stepjournal push`` and ``stepjournal clone`` in fresh processes.

One moto S3 server on 127.0.0.1 serves a journal of ``payloads`` payloads (84 MB in 40 by default,
each a new random batch of bytes, as issue 29 sets it). Each repetition times, alternating the order:

- ``client_put``: obstore puts each stored payload blob as an object of its own, in this process;
- ``push_cli``: ``stepjournal push JOURNAL URL`` in a fresh process (interpreter start included);
- ``client_get_durable``: obstore gets each object and writes it to a file of its own, fsynced (the get
  plus the durable write no durable pull can skip);
- ``clone_cli``: ``stepjournal clone URL FOLDER`` in a fresh process: every payload fetched, its
  digest checked and written durably, the events replayed into a new journal.

Goals (issue 29): push <= 1.25x the client's put; the clone <= 1.2x the client's get plus a durable
write. Run it alone with ``python -m benchmarks._bench_share_cli [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Dict, List

from ._bench_s3 import _BUCKET, get_durably, moto_bucket
from ._measure import cli_command, quiet_logs
from ._report import _goal

__all__ = ["GOAL_CLONE", "GOAL_PUSH", "bench_share_cli", "main"]

GOAL_PUSH = 1.25
GOAL_CLONE = 1.2
TOTAL_BYTES = 84 * 1000 * 1000
PAYLOADS = 40


def bench_share_cli(ctx: Any) -> Dict[str, Any]:
    """The section for `benchmarks._cli`; `ctx` is a `benchmarks._suite.Context`."""
    return _bench(ctx.workdir, quick=ctx.reps <= 3, progress=ctx.progress)


def _cli(*args: str) -> None:
    """``stepjournal ARGS`` in a fresh process (`cli_command`, its memory sampled every 5 ms)."""
    done = cli_command(list(args), every=0.005)
    if done["rc"] != 0:
        raise RuntimeError(f"stepjournal {args[0]} failed ({done['rc']}): {done['stderr_tail']}")


def _bench(workdir: Path, *, quick: bool, progress: Callable[[str], None]) -> Dict[str, Any]:
    """quick: 4.2 MB in 8 payloads, 2 repetitions; else 84 MB in 40, 3 repetitions."""
    total, payloads, reps = (TOTAL_BYTES // 20, 8, 2) if quick else (TOTAL_BYTES, PAYLOADS, 3)
    import obstore
    import torch

    from stepjournal import Journal

    root = Path(tempfile.mkdtemp(prefix="share-cli-", dir=workdir))
    times: Dict[str, List[float]] = {k: [] for k in ("client_put", "push_cli", "client_get_durable", "clone_cli")}
    try:
        with moto_bucket() as (_endpoint, store):
            source = root / "recorded"
            generator = torch.Generator().manual_seed(29)
            with Journal(source, run="share") as journal:
                for step in range(1, payloads + 1):
                    batch = {"tokens": torch.randint(0, 255, (total // payloads,), dtype=torch.uint8, generator=generator)}
                    journal.record(step, batch)
                blobs = [journal.payload_bytes(journal.lookup(step).event.output.digest) for step in range(1, payloads + 1)]
            nbytes = sum(len(b) for b in blobs)
            progress(f"sharing through the CLI: {payloads} payloads, {nbytes / 1e6:.1f} MB, {reps} repetitions")
            for rep in range(reps):
                prefix = f"rep{rep}-{uuid.uuid4().hex[:8]}"
                url = f"s3://{_BUCKET}/{prefix}"
                durable = root / f"durable{rep}"
                target = root / f"clone{rep}"

                def client_put() -> None:
                    for i, blob in enumerate(blobs):
                        obstore.put(store, f"raw-{prefix}/{i}", blob, use_multipart=False)

                def client_get_durable() -> None:
                    get_durably(store, [f"raw-{prefix}/{i}" for i in range(len(blobs))], durable)

                pairs = [[("client_put", client_put), ("push_cli", lambda: _cli("push", str(source), url))],
                         [("client_get_durable", client_get_durable), ("clone_cli", lambda: _cli("clone", url, str(target)))]]
                for pair in pairs:  # put before get: the gets read what the puts wrote
                    for name, fn in (pair if rep % 2 == 0 else pair[::-1]):
                        started = time.perf_counter()
                        fn()
                        times[name].append(time.perf_counter() - started)
                shutil.rmtree(durable)
                shutil.rmtree(target)
                progress(f"sharing rep {rep + 1}/{reps}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratios = {"push_cli_vs_client_put": med["push_cli"] / med["client_put"],
              "clone_cli_vs_client_get_durable": med["clone_cli"] / med["client_get_durable"]}
    basis = f"moto S3 server on 127.0.0.1, {payloads} payloads, {nbytes / 1e6:.1f} MB, CLI in a fresh process, median of {reps}"
    return {
        "payloads": payloads,
        "payload_bytes": nbytes,
        "repetitions": reps,
        "times_s": {k: [round(x, 4) for x in v] for k, v in times.items()},
        "median_s": {k: round(v, 4) for k, v in med.items()},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "ratios": {k: round(v, 3) for k, v in ratios.items()},
        "goals": {
            "push_cli_vs_client_put": _goal(ratios["push_cli_vs_client_put"], GOAL_PUSH, "<=", "x", basis),
            "clone_cli_vs_client_get_durable": _goal(ratios["clone_cli_vs_client_get_durable"], GOAL_CLONE, "<=", "x",
                                                     basis + "; vs get + a durable write of each"),
        },
    }


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks._bench_share_cli", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="4.2 MB in 8 payloads, 2 repetitions")
    args = p.parse_args(argv)
    quiet_logs()
    with tempfile.TemporaryDirectory(prefix="stepjournal-bench-share-") as workdir:
        report = _bench(Path(workdir), quick=args.quick, progress=lambda m: print(m, file=sys.stderr))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
