"""A real S3 server for the tests: moto in server mode, in its own process on a free port of 127.0.0.1.

`s3_server` (session fixture) starts it once and stops it at the end; `s3_env` (per test) points the
client's usual environment variables at it and yields a fresh bucket's URL base. Nothing here mocks
the client library: obstore speaks HTTP to the server.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from typing import Dict, Iterator, Optional

import pytest

SECRET = "sEcReT-4f1c9a7e-never-shown"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_moto(env: Optional[Dict[str, str]] = None) -> tuple:
    """(the server process, its endpoint); `env`: moto's settings beside the environment (e.g.
    ``INITIAL_NO_AUTH_ACTION_COUNT=0``: every request's credentials are checked)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return proc, f"http://127.0.0.1:{port}"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("the moto server did not start")
            time.sleep(0.1)


def client_env(endpoint: str) -> Dict[str, str]:
    """The environment a client process needs to reach the server (credentials as usual: variables)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": "testing-key-id",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_REGION": "us-east-1",
    }


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    proc, endpoint = start_moto()
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def make_bucket(endpoint: str) -> str:
    import boto3  # moto[server] brings it; only the test's own set-up uses it

    name = f"b-{uuid.uuid4().hex[:12]}"
    env = client_env(endpoint)
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                 aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region_name="us-east-1").create_bucket(Bucket=name)
    return name


@pytest.fixture
def s3_env(s3_server, monkeypatch) -> Iterator[str]:
    """A fresh bucket; the environment points the client at the server. Yields ``s3://bucket``."""
    for key, value in client_env(s3_server).items():
        monkeypatch.setenv(key, value)
    yield f"s3://{make_bucket(s3_server)}"


def subprocess_env(endpoint: str) -> Dict[str, str]:
    env = dict(os.environ)
    env.update(client_env(endpoint))
    return env
