"""Cold replay with the one-call read (`bytes()`, as before wave 6) vs the counted stream `Remote` uses now.

One moto S3 server on 127.0.0.1, one recorded step of the benchmark batch pushed to it; each
repetition gets the object with obstore (the floor), then replays the step through a journal whose
payloads live only on the remote (no cache) with each read in turn, the order alternated, in one
process and one minute. The old read is kept here only to be measured against: it trusts the
server's framing (docs/reliability.md, "a hostile S3 server"). Prints medians of wall and CPU time
(user + system of this process) and the load average. Run: ``python -m benchmarks._bench_remote_read
[--reps N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from ._bench_s3 import _BUCKET, _CREDENTIALS, moto_server
from ._measure import quiet_logs
from ._workload import Workload, make_batch, mark

__all__ = ["main"]


def _one_call_read(self: Any, key: str, limit: int) -> Tuple[Optional[Any], Optional[str]]:
    """`Remote._read` as it was: the size announced checked, then the whole body in one client call."""
    from stepjournal.errors import IntegrityError

    result = self._obstore.get(self._store, key)
    if int(result.meta["size"]) > limit:
        raise IntegrityError(f"{key} is oversized")
    body = result.bytes()
    if len(body) > limit:
        raise IntegrityError(f"{key} sends more than it may hold")
    return body, result.meta.get("e_tag")


def _timed(fn: Callable[[], Any]) -> Tuple[float, float]:
    def used() -> float:
        me = resource.getrusage(resource.RUSAGE_SELF)
        return me.ru_utime + me.ru_stime
    cpu, wall = used(), time.perf_counter()
    fn()
    return time.perf_counter() - wall, used() - cpu


def main(argv: List[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks._bench_remote_read", description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    quiet_logs()
    import boto3
    import obstore
    from obstore.store import S3Store

    from stepjournal import Journal
    from stepjournal.payloads import ObjectPayloadStore
    from stepjournal.sharing import push
    from stepjournal.payloads._object_client import Remote

    counted_read = Remote._read
    os.environ.update(_CREDENTIALS)
    with tempfile.TemporaryDirectory(prefix="stepjournal-bench-read-") as work, moto_server() as endpoint:
        os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"})
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=_BUCKET)
        store = S3Store(_BUCKET, endpoint=endpoint, client_options={"allow_http": True})
        batch = make_batch(Workload())
        source = Path(work) / "recorded"
        with Journal(source, run="bench") as journal:
            mark(batch, 1.0)
            journal.record(1, batch)
            blob = journal.payload_bytes(journal.lookup(1).event.output.digest)
        url = f"s3://{_BUCKET}/p"
        push(str(source), url)
        obstore.put(store, "raw", blob, use_multipart=False)
        figures: Dict[str, List[Tuple[float, float]]] = {"raw_get": [], "one_call": [], "counted": []}
        started = time.strftime("%H:%M:%S", time.gmtime())
        try:
            for rep in range(args.reps):
                figures["raw_get"].append(_timed(lambda: obstore.get(store, "raw").bytes()))
                for name in (("one_call", "counted") if rep % 2 == 0 else ("counted", "one_call")):
                    Remote._read = _one_call_read if name == "one_call" else counted_read
                    with Journal(source, readonly=True, run="bench", payload_store=ObjectPayloadStore(url)) as journal:
                        recorded = journal.lookup(1)
                        figures[name].append(_timed(lambda: journal.load_output(recorded)))
        finally:
            Remote._read = counted_read
    med = {k: [round(statistics.median(x[i] for x in v), 4) for i in (0, 1)] for k, v in figures.items()}
    print(json.dumps({
        "payload_bytes": len(blob), "repetitions": args.reps,
        "utc": [started, time.strftime("%H:%M:%S", time.gmtime())],
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "median_wall_cpu_s": med,
        "cold_replay_vs_client_get": {k: round(med[k][0] / med["raw_get"][0], 3) for k in ("one_call", "counted")},
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
