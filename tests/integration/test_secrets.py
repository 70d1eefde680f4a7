"""No secret in any output: a password in a remote URL, in an endpoint variable or in a server's
redirect reaches no error, log line, progress line, ``--json`` report, recorded origin or audit,
while the host it was sent to is still named (docs/sharing.md, "Secrets")."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from log_capture import captured_events
from redirect_server import PASSWORD as REDIRECT_PASSWORD
from redirect_server import redirect_server  # noqa: F401  (fixture)
from s3_server import free_port, s3_env, s3_server, subprocess_env  # noqa: F401  (fixtures)
from stepjournal import Journal
from stepjournal.errors import RemoteError
from stepjournal.events import EventsImported
from stepjournal.sharing import clone, pull, push, redact

BIN = os.path.dirname(sys.executable)
PASSWORD = "pAsSwOrD-71c3e0-never-shown"


def record(path):
    with Journal(str(path), run="exp") as journal:
        for step in (1, 2):
            journal.record(step, {"ids": torch.arange(4) * step})


def with_password(url: str) -> str:
    """``scheme://user:PASSWORD@rest`` for ``scheme://rest``."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://alice:{PASSWORD}@{rest}"


# -- the one function ---------------------------------------------------------------------------------
_HOST = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,20}(:[0-9]{1,5})?", fullmatch=True)
_INFO = st.text(st.characters(blacklist_categories=("Cs", "Zs", "Cc"), blacklist_characters="/?#\\"), min_size=1)


@given(scheme=st.sampled_from(["http", "https", "s3", "file", "gs", "az"]), user=_INFO, password=_INFO, host=_HOST)
def test_redact_strips_the_user_info_of_a_url_anywhere_in_a_text_and_keeps_the_rest(scheme, user, password, host):
    text = f"GET {scheme}://{user}:{password}@{host}/bucket/key failed: {scheme}://{host}/other"
    assert redact(text) == f"GET {scheme}://{host}/bucket/key failed: {scheme}://{host}/other"


def test_the_password_of_an_endpoint_variable_is_hidden_even_where_a_client_quotes_it_alone(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://alice:p%40ss-Secret-Word@minio.internal:9000")
    assert redact("auth p@ss-Secret-Word and p%40ss-Secret-Word refused") == "auth *** and *** refused"
    assert redact("alice@minio.internal") == "alice@minio.internal"  # the user name is no secret


# -- the Python API, against a real S3 server -------------------------------------------------------
def test_push_clone_and_pull_with_a_password_in_the_url_store_and_log_it_nowhere(tmp_path, s3_env):
    record(tmp_path / "a")
    url = with_password(s3_env + "/exp")
    labels = []
    with captured_events(logging.DEBUG) as events:
        reports = [push(str(tmp_path / "a"), url, progress=lambda *shown: labels.append(shown)),
                   clone(url, tmp_path / "b", progress=lambda *shown: labels.append(shown)),
                   pull(url, str(tmp_path / "b"))]
    assert reports[1].events_pulled == 3
    with Journal(str(tmp_path / "b"), readonly=True) as journal:
        origins = [event.origin for _seq, event in journal.events(types=[EventsImported])]
        audit = journal.audit()
    assert origins == [s3_env + "/exp"]  # the bucket is named, the password is not
    shown = repr([events, labels, reports, audit])
    assert PASSWORD not in shown and "journal_pulled" in shown and s3_env[len("s3://"):] in shown
    for name in os.listdir(tmp_path / "b"):
        assert PASSWORD.encode() not in (tmp_path / "b" / name).read_bytes()


@pytest.mark.parametrize("where", ["url", "endpoint variable"])
def test_an_unreachable_remote_is_named_by_host_and_never_by_password(tmp_path, s3_env, monkeypatch, where):
    record(tmp_path / "a")
    host = f"127.0.0.1:{free_port()}"  # nothing listens there
    if where == "url":
        url = f"http://alice:{PASSWORD}@{host}/bucket/exp"
    else:
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://alice:{PASSWORD}@{host}")
        url = s3_env + "/exp"
    with captured_events(logging.DEBUG) as events:
        for verb in (lambda: push(str(tmp_path / "a"), url), lambda: clone(url, tmp_path / "b"),
                     lambda: pull(url, str(tmp_path / "a"))):
            with pytest.raises(RemoteError) as caught:
                verb()
            assert PASSWORD not in str(caught.value) and host in str(caught.value)
    assert PASSWORD not in repr(events)


def test_a_server_that_redirects_to_a_url_with_a_password_is_quoted_without_it(tmp_path, s3_env, redirect_server,
                                                                                monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", redirect_server)
    with captured_events(logging.DEBUG) as events, pytest.raises(RemoteError) as caught:
        clone(s3_env + "/exp", tmp_path / "b")
    message = str(caught.value)
    assert REDIRECT_PASSWORD not in message and "mallory" not in message
    assert redirect_server[len("http://"):] in message and "400 Bad Request" in message
    assert REDIRECT_PASSWORD not in repr(events)


# -- the command line, typed in a shell -------------------------------------------------------------
def shell(line: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"export PATH={BIN}:$PATH; {line}"], capture_output=True, text=True,
                          env=env, timeout=300)


def test_the_command_line_shows_a_password_nowhere_and_names_the_host(tmp_path, s3_env, s3_server, redirect_server):
    record(tmp_path / "a")
    a, b, env = tmp_path / "a", tmp_path / "b", subprocess_env(s3_server)
    url = with_password(s3_env + "/exp")
    runs = [shell(f"stepjournal -vv push {a} '{url}'", env),
            shell(f"stepjournal -vv push {a} '{url}' --json", env),
            shell(f"stepjournal -vv clone '{url}' {b} --json", env),
            shell(f"stepjournal -vv pull '{url}' {b}", env),
            shell(f"stepjournal audit {b} --json", env),
            shell(f"stepjournal audit {b} --wide", env),
            shell(f"stepjournal show {b} 2 --run exp --json", env)]
    assert [r.returncode for r in runs] == [0] * len(runs), [r.stderr for r in runs]
    assert "push" in runs[0].stderr and "pull" in runs[2].stderr  # the progress lines
    assert f"to {s3_env}/exp" in runs[0].stdout  # the remote is named, without its user info
    host = f"127.0.0.1:{free_port()}"
    failed = [shell(f"stepjournal -vv pull 'http://alice:{PASSWORD}@{host}/bucket/exp' {b}", env),
              shell(f"AWS_ENDPOINT_URL='http://alice:{PASSWORD}@{host}' stepjournal -vv clone {s3_env}/exp {tmp_path / 'c'}",
                    env),
              shell(f"AWS_ENDPOINT_URL={redirect_server} stepjournal -vv clone {s3_env}/exp {tmp_path / 'd'} --json", env)]
    assert [r.returncode for r in failed] == [1, 1, 1]
    assert host in failed[0].stderr and host in failed[1].stderr and redirect_server[7:] in failed[2].stderr
    for r in runs + failed:
        assert PASSWORD not in r.stdout + r.stderr and REDIRECT_PASSWORD not in r.stdout + r.stderr
