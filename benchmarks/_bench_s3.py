"""Which S3 client the object store uses, by measurement: put/get throughput of the same bytes.

Every installed candidate (obstore, boto3, s3fs) writes and reads the same objects (1 MiB and
32 MiB of random bytes by default) against one moto S3 server started on 127.0.0.1 in its own
process for this run, interleaved in a rotating order so they meet the same server state. Figures
are the median of the repetitions, in MiB/s. A candidate that is not installed is reported as such.

Run it alone with ``python -m benchmarks._bench_s3 [--sizes 1,32] [--reps N] [--quick]``; the result
and the reasoning behind the choice are in docs/sharing.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

__all__ = ["aws_environment", "bench_s3_clients", "get_durably", "moto_bucket", "moto_server", "main"]

_BUCKET = "bench"
_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench-secret", "AWS_REGION": "us-east-1"}


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto S3 server in its own process on a free port of 127.0.0.1; yields its endpoint URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the moto server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@contextlib.contextmanager
def aws_environment(values: Dict[str, str]) -> Iterator[None]:
    """`values` set in ``os.environ`` (as a user's shell would, so child processes see them too); every
    AWS variable set inside is put back as it was on the way out."""
    names = ("AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", *_CREDENTIALS, *values)
    saved = {k: os.environ.get(k) for k in names}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@contextlib.contextmanager
def moto_bucket() -> Iterator[Tuple[str, Any]]:
    """`moto_server` with the bench bucket made and the AWS environment pointing at it, so a
    ``stepjournal`` child process finds it too; yields (endpoint, obstore S3Store)."""
    import boto3
    from obstore.store import S3Store

    with aws_environment(_CREDENTIALS), moto_server() as endpoint:
        os.environ.update({"AWS_ENDPOINT_URL": endpoint, "AWS_ALLOW_HTTP": "true"})
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=_BUCKET)
        yield endpoint, S3Store(_BUCKET, endpoint=endpoint, client_options={"allow_http": True})


def get_durably(store: Any, keys: List[str], folder: Any) -> None:
    """obstore's get of each key written to a new file of its own in `folder`, fsynced: a get plus the
    durable write no durable pull can skip."""
    import obstore

    os.makedirs(folder)
    for i, key in enumerate(keys):
        with open(os.path.join(folder, str(i)), "wb") as out:
            out.write(obstore.get(store, key).bytes())
            out.flush()
            os.fsync(out.fileno())


Client = Tuple[Callable[[str, bytes], None], Callable[[str], bytes]]


def _obstore(endpoint: str) -> Client:
    import obstore
    from obstore.store import S3Store

    store = S3Store(_BUCKET, endpoint=endpoint, client_options={"allow_http": True})
    # One PUT per object, as the payload store writes them (obstore splits larger bodies into a
    # multipart upload by default; a single PUT is atomic and needs no clean-up when interrupted).
    def put(key: str, data: bytes) -> None:
        obstore.put(store, key, data, use_multipart=False)

    return put, (lambda key: bytes(obstore.get(store, key).bytes()))


def _boto3(endpoint: str) -> Client:
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint)

    def get(key: str) -> bytes:
        return s3.get_object(Bucket=_BUCKET, Key=key)["Body"].read()

    return (lambda key, data: s3.put_object(Bucket=_BUCKET, Key=key, Body=data)), get


def _s3fs(endpoint: str) -> Client:
    import s3fs

    fs = s3fs.S3FileSystem(endpoint_url=endpoint, use_listings_cache=False)
    return (lambda key, data: fs.pipe_file(f"{_BUCKET}/{key}", data)), (lambda key: fs.cat_file(f"{_BUCKET}/{key}"))


CANDIDATES: Dict[str, Callable[[str], Client]] = {"obstore": _obstore, "boto3": _boto3, "s3fs": _s3fs}


def bench_s3_clients(*, sizes_mib: List[int], reps: int, progress: Callable[[str], None] = lambda m: None) -> Dict[str, Any]:
    """Put and get throughput (MiB/s, median of `reps`) of each installed client, per object size."""
    with aws_environment(_CREDENTIALS):
        with moto_server() as endpoint:
            import boto3  # moto[server] depends on it: creating the bucket needs no candidate

            boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=_BUCKET)
            clients: Dict[str, Client] = {}
            result: Dict[str, Any] = {"endpoint": "moto server on 127.0.0.1", "reps": reps, "clients": {}}
            for name, make in CANDIDATES.items():
                try:
                    clients[name] = make(endpoint)
                except ImportError as exc:
                    result["clients"][name] = {"installed": False, "why": str(exc)}
            for size in sizes_mib:
                data = os.urandom(size << 20)
                times: Dict[str, Dict[str, List[float]]] = {n: {"put": [], "get": []} for n in clients}
                names = list(clients)
                for rep in range(reps):
                    # A rotating order: no client always goes first (or last) against the server.
                    for name in names[rep % len(names):] + names[: rep % len(names)]:
                        put, get = clients[name]
                        key = f"{name}/{size}/{uuid.uuid4().hex}"
                        start = time.perf_counter()
                        put(key, data)
                        times[name]["put"].append(time.perf_counter() - start)
                        start = time.perf_counter()
                        got = get(key)
                        times[name]["get"].append(time.perf_counter() - start)
                        if got != data:
                            raise RuntimeError(f"{name} read back other bytes than it wrote")
                for name in names:
                    entry = result["clients"].setdefault(name, {"installed": True})
                    for op in ("put", "get"):
                        median = statistics.median(times[name][op])
                        entry[f"{op}_{size}mib_mib_s"] = round(size / median, 1)
                progress(f"s3 clients, {size} MiB objects: " + ", ".join(
                    f"{n} put {result['clients'][n][f'put_{size}mib_mib_s']} get {result['clients'][n][f'get_{size}mib_mib_s']} MiB/s"
                    for n in names))
            return result


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks._bench_s3", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="1,32", help="object sizes in MiB, comma-separated (default 1,32)")
    p.add_argument("--reps", type=int, default=7, help="repetitions per figure (default 7)")
    p.add_argument("--quick", action="store_true", help="1 MiB objects, 2 repetitions")
    args = p.parse_args(argv)
    sizes = [1] if args.quick else [int(s) for s in args.sizes.split(",")]
    reps = 2 if args.quick else args.reps
    report = bench_s3_clients(sizes_mib=sizes, reps=reps, progress=lambda m: print(m, file=sys.stderr))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
