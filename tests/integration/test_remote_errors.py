"""Each object-store misconfiguration, made for real against a moto S3 server and typed in a shell:
one error line that says what to do, exit status 1, no traceback; the typed `RemoteError` from Python."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from region_server import BUCKET_REGION, region_server  # noqa: F401
from s3_server import free_port, make_bucket, s3_env, s3_server, start_moto, subprocess_env  # noqa: F401
from stepjournal import Journal
from stepjournal.errors import (RemoteCredentialsError, RemoteError, RemoteMissingError, RemotePlainHttpError,
                                RemoteRegionError, RemoteUnreachableError)
from stepjournal.sharing import clone, pull, push, remote_status

BIN = os.path.dirname(sys.executable)
VERBS = ["push {a} {url}", "pull {url} {a}", "clone {url} {b}", "status {a} {url}"]


@pytest.fixture(scope="module")
def checking_server():
    """A second moto server that checks every request's credentials (the test's keys are unknown to it)."""
    proc, endpoint = start_moto({"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def journal(tmp_path):
    with Journal(str(tmp_path / "a"), run="exp") as j:
        j.record(1, {"ids": torch.arange(4)})
    return tmp_path / "a"


def refused(tmp_path, journal, url, env, hint):
    """Every verb that talks to `url` fails with one line holding `hint`, exit status 1, no traceback."""
    for verb in VERBS:
        line = "stepjournal " + verb.format(a=journal, b=tmp_path / "b", url=url)
        done = subprocess.run(["bash", "-c", f"export PATH={BIN}:$PATH; {line}"], capture_output=True, text=True,
                              env=env, timeout=300)
        assert done.returncode == 1 and done.stdout == "", (line, done.stdout, done.stderr)
        lines = done.stderr.splitlines()
        assert len(lines) == 1, (line, lines)
        (message,) = lines
        assert message.startswith("stepjournal: error: ") and hint in message, (line, message)
        assert "Traceback" not in done.stderr and "Debug source" not in message and "<?xml" not in message
        assert not (tmp_path / "b").exists()  # a failed clone leaves nothing


def python_raises(journal, url, cls, tmp_path):
    for verb in (lambda: push(str(journal), url), lambda: pull(url, str(journal)),
                 lambda: clone(url, str(tmp_path / "b")), lambda: remote_status(str(journal), url)):
        with pytest.raises(cls):
            verb()


def test_a_plain_http_endpoint_without_aws_allow_http_says_to_set_it(tmp_path, journal, s3_env, s3_server):
    env = {**subprocess_env(s3_server), "AWS_ALLOW_HTTP": "false"}
    refused(tmp_path, journal, s3_env, env, "set AWS_ALLOW_HTTP=true to use an http:// endpoint")
    env.pop("AWS_ALLOW_HTTP")
    refused(tmp_path, journal, s3_env, env, f"{s3_server} is plain HTTP")


def test_a_missing_bucket_says_to_check_the_bucket_or_create_it(tmp_path, journal, s3_env, s3_server):
    url = s3_env + "-missing/team"
    refused(tmp_path, journal, url, subprocess_env(s3_server), "the bucket does not exist at " + s3_server)
    python_raises(journal, url, RemoteMissingError, tmp_path)


def test_refused_credentials_say_which_variables_to_check(tmp_path, journal, checking_server, monkeypatch):
    env = subprocess_env(checking_server)
    refused(tmp_path, journal, "s3://team-bucket/x", env,
            "refused the credentials (InvalidAccessKeyId); check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    for key in ("AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(key, env[key])
    python_raises(journal, "s3://team-bucket/x", RemoteCredentialsError, tmp_path)


def test_an_endpoint_nothing_answers_at_says_to_check_it(tmp_path, journal, s3_env, s3_server, monkeypatch):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    env = {**subprocess_env(s3_server), "AWS_ENDPOINT_URL": endpoint}
    refused(tmp_path, journal, s3_env, env, f"cannot connect to {endpoint} (Connection refused); check the endpoint")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    python_raises(journal, s3_env, RemoteUnreachableError, tmp_path)


def test_a_bucket_in_another_region_says_which_region_to_set(tmp_path, journal, s3_server, region_server, monkeypatch):
    """The endpoint holds its buckets in eu-west-1, as AWS would; the client signs for us-east-1."""
    url = f"s3://{make_bucket(s3_server)}/team"
    env = {**subprocess_env(region_server), "AWS_REGION": "us-east-1"}
    refused(tmp_path, journal, url, env,
            f"the bucket is in region {BUCKET_REGION}, not us-east-1, which the request was signed for; "
            f"set AWS_REGION={BUCKET_REGION}")
    for key in ("AWS_ENDPOINT_URL", "AWS_ALLOW_HTTP", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        monkeypatch.setenv(key, env[key])
    python_raises(journal, url, RemoteRegionError, tmp_path)
    # What the line says to do works: the same commands with the bucket's region.
    line = f"export AWS_REGION={BUCKET_REGION}; stepjournal push {journal} {url} && stepjournal status {journal} {url}"
    done = subprocess.run(["bash", "-c", f"export PATH={BIN}:$PATH; {line}"], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "push would send 0 events" in done.stdout and "pull would fetch 0 events" in done.stdout, done.stdout


def test_each_refusal_is_a_remote_error_that_documents_what_to_do():
    for cls in (RemotePlainHttpError, RemoteMissingError, RemoteCredentialsError, RemoteUnreachableError,
                RemoteRegionError):
        assert issubclass(cls, RemoteError) and cls.__doc__
