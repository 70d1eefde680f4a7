"""Named remotes, `status`, plain paths as remotes: typed in a shell as a user types them, against a
real S3 server (moto on 127.0.0.1) and local folders. Two journal folders stand for two machines."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from doc_lines import command_lines, matches, prompted_lines, run_line
from s3_server import client_env, s3_env, s3_server  # noqa: F401  (fixtures)
from stepjournal import Journal
from stepjournal.errors import RemoteConfigError, RemoteUrlSecretError
from stepjournal.sharing import add_remote, clone, list_remotes, pull, push, remote_status, remove_remote

DOC_LINES = command_lines("docs/sharing.md", section="Named remotes and status")
SHARING = Path(__file__).resolve().parents[2] / "docs" / "sharing.md"
PASSWORD = "pA55-w0rd-4e1d-never-stored"


def record(path, steps, *, run="exp1"):
    with Journal(str(path), run=run) as journal:
        for step in steps:
            journal.record(step, {"ids": torch.arange(4) * step})


def shell(line, cwd, env=None):
    return run_line(line, cwd, env=env, timeout=300)


def docs_session():
    """(command, expected stdout lines) of each ``$ `` line in docs/sharing.md's "Named remotes" section."""
    section = SHARING.read_text(encoding="utf-8").split("### Named remotes and status", 1)[1].split("\n### ", 1)[0]
    return [step for body in re.findall(r"^```console\n(.*?)^```", section, re.S | re.M) for step in prompted_lines(body)]


# -- the documented session, run through a shell -----------------------------------------------------
def test_the_documented_session_adds_a_remote_pushes_by_name_shows_status_and_clones_on_machine_b(
        tmp_path, s3_env, s3_server):
    """docs/sharing.md "Named remotes and status", line by line: each command's stdout as the page shows it."""
    record(tmp_path / "machine-a", [1, 2])
    bucket, env = s3_env[len("s3://"):], {**client_env(s3_server), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    steps = docs_session()
    assert len(steps) >= 8 and [command for command, _ in steps] == [line.text for line in DOC_LINES]
    for command, expected in steps:
        done = shell(command.replace("s3://bucket", s3_env), tmp_path, env)
        assert done.returncode == 0, (command, done.stderr)
        got = done.stdout.replace(bucket, "bucket").rstrip("\n").splitlines()
        assert len(got) == len(expected) and all(matches(e, g) for e, g in zip(expected, got)), (command, got)
    with Journal(str(tmp_path / "machine-b"), readonly=True, run="exp1") as journal:
        assert journal.recorded_steps() == [1, 2, 3]


def test_status_counts_exactly_what_the_push_then_sends_and_the_pull_then_fetches(tmp_path, s3_env):
    a, b, url = tmp_path / "a", tmp_path / "b", s3_env + "/team"
    record(a, [1, 2])
    add_remote(str(a), "origin", url)
    before = remote_status(str(a))
    sent = push(str(a))
    assert (before.to_push_events, before.to_push_payloads, before.to_push_bytes) == (
        sent.events_sent, sent.payloads_sent, sent.bytes_sent) == (3, 2, sent.bytes_sent)
    after = remote_status(str(a), "origin")
    assert (after.to_push_events, after.to_push_payloads, after.to_push_bytes, after.to_pull_events) == (0, 0, 0, 0)
    clone(url, str(b))
    record(a, [3])
    push(str(a), "origin")
    waiting = remote_status(str(b))  # b's default is origin, set by the clone
    fetched = pull(None, str(b))
    assert (waiting.to_pull_events, waiting.to_pull_payloads, waiting.to_pull_bytes, waiting.to_pull_sources) == (
        fetched.events_pulled, fetched.payloads_fetched, fetched.bytes_fetched, fetched.sources) == (
        2, 1, fetched.bytes_fetched, fetched.sources)
    assert remote_status(str(b)).to_pull_events == 0


def test_status_sends_writes_and_creates_nothing(tmp_path, s3_env):
    record(tmp_path / "a", [1])
    folder = tmp_path / "not-yet"
    assert remote_status(str(tmp_path / "a"), str(folder)).to_push_events == 2  # a folder a push would create
    assert not folder.exists()
    assert remote_status(str(tmp_path / "a"), s3_env + "/x").to_push_payloads == 1
    from stepjournal.payloads._object_client import Remote  # private: the object client under test

    assert Remote(s3_env).keys("") == []


# -- the config -----------------------------------------------------------------------------------
def test_the_first_remote_is_the_default_until_another_is_added_with_default_or_it_is_removed(tmp_path):
    record(tmp_path / "a", [1])
    a = str(tmp_path / "a")
    add_remote(a, "one", str(tmp_path / "r1"))
    add_remote(a, "two", str(tmp_path / "r2"))
    assert [(r.name, r.default) for r in list_remotes(a)] == [("one", True), ("two", False)]
    add_remote(a, "three", (tmp_path / "r3").as_uri(), default=True)
    assert [r.name for r in list_remotes(a) if r.default] == ["three"]
    remove_remote(a, "three")
    assert [(r.name, r.default) for r in list_remotes(a)] == [("one", True), ("two", False)]
    assert list_remotes(a)[1].url == (tmp_path / "r2").as_uri()  # a path is kept as its absolute file:// URL
    with pytest.raises(RemoteConfigError, match="has a remote named 'one' already"):
        add_remote(a, "one", str(tmp_path / "r4"))
    with pytest.raises(RemoteConfigError, match="is not a remote name"):
        add_remote(a, "../up", str(tmp_path / "r4"))


def test_a_name_that_is_no_remote_and_no_folder_is_refused_with_what_to_type(tmp_path):
    record(tmp_path / "a", [1])
    done = shell("stepjournal push a orign", tmp_path)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "has no remote named 'orign'" in done.stderr and "./orign" in done.stderr
    assert not (tmp_path / "orign").exists()
    done = shell("stepjournal push a", tmp_path)
    assert done.returncode == 1 and "has no default remote" in done.stderr and "stepjournal remote add" in done.stderr


@pytest.mark.parametrize("url", [f"s3://alice:{PASSWORD}@bucket/team", f"http://alice:{PASSWORD}@minio:9000/bucket",
                                 f"s3://bucket/team?X-Amz-Signature={PASSWORD}"])
def test_a_url_with_a_password_is_refused_by_remote_add_and_written_nowhere(tmp_path, url):
    record(tmp_path / "a", [1])
    before = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    done = shell(f"stepjournal remote add a origin '{url}'", tmp_path)
    assert done.returncode == 1 and done.stdout == "" and "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("stepjournal: error: refused remote 'origin'") and "keeps no credentials" in line
    assert "AWS_ACCESS_KEY_ID" in line and "~/.aws/credentials" in line and PASSWORD not in line
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()} == before  # no remotes.json
    with pytest.raises(RemoteUrlSecretError):
        add_remote(str(tmp_path / "a"), "origin", url)
    assert not (tmp_path / "a" / "remotes.json").exists()


def test_a_clone_names_its_url_origin_without_the_password_it_was_given(tmp_path, s3_env):
    record(tmp_path / "a", [1])
    push(str(tmp_path / "a"), s3_env)
    clone(s3_env.replace("s3://", f"s3://alice:{PASSWORD}@"), str(tmp_path / "b"))
    assert [(r.name, r.url, r.default) for r in list_remotes(str(tmp_path / "b"))] == [("origin", s3_env, True)]
    assert PASSWORD not in (tmp_path / "b" / "remotes.json").read_text()


# -- plain paths ----------------------------------------------------------------------------------
def test_a_plain_relative_path_is_a_remote_for_push_pull_clone_and_status(tmp_path):
    work = tmp_path / "work"
    record(work / "a", [1, 2])
    runs = [shell("stepjournal push a ../team-remote", work),
            shell("stepjournal clone ../team-remote b", work),
            shell("stepjournal status a ../team-remote --json", work)]
    assert [r.returncode for r in runs] == [0, 0, 0], [r.stderr for r in runs]
    assert "cloned 3 events, 2 payloads" in runs[1].stdout and (tmp_path / "team-remote" / "heads").is_dir()
    assert json.loads(runs[2].stdout)["url"] == (tmp_path / "team-remote").as_uri()
    record(work / "a", [3])
    runs = [shell("stepjournal push a ../team-remote", work), shell("stepjournal pull ../team-remote b", work)]
    assert [r.returncode for r in runs] == [0, 0], [r.stderr for r in runs]
    assert "pulled 2 events, 1 payloads" in runs[1].stdout
    with Journal(str(work / "b"), readonly=True, run="exp1") as journal:
        assert journal.recorded_steps() == [1, 2, 3]


# -- your own remotes (--global) ---------------------------------------------------------------------
def test_your_own_remotes_are_seen_by_every_journal_and_by_clone_and_are_never_a_default(tmp_path, monkeypatch):
    from stepjournal.sharing import resolve_clone_source, user_config_folder

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    team, other = tmp_path / "team-remote", tmp_path / "other-remote"
    record(tmp_path / "a", [1, 2])
    made = shell(f"stepjournal remote add --global team {team}", tmp_path)
    assert made.returncode == 0 and made.stdout == f"remote team is file://{team}\n", made.stderr
    assert user_config_folder() == str(tmp_path / "config" / "stepjournal")
    assert [(r.name, r.default) for r in list_remotes(None)] == [("team", False)]  # yours: never a default
    pushed = shell("stepjournal push a team", tmp_path)  # the journal has no remote: yours is found
    assert pushed.returncode == 0 and f"to file://{team}" in pushed.stdout, pushed.stderr
    bare = shell("stepjournal push a", tmp_path)
    assert bare.returncode == 1 and "has no default remote" in bare.stderr  # yours is not used unasked
    cloned = shell("stepjournal clone team b", tmp_path)
    assert cloned.returncode == 0, cloned.stderr
    assert [(r.name, r.url) for r in list_remotes(str(tmp_path / "b"))] == [("origin", f"file://{team}")]
    add_remote(str(tmp_path / "a"), "team", str(other))  # the journal and you name two places "team": refused
    refused = shell("stepjournal push a team", tmp_path)
    assert refused.returncode == 1 and f"file://{other} in journal" in refused.stderr, refused.stderr
    assert f"file://{team} in your remotes" in refused.stderr and not other.exists()
    assert resolve_clone_source("s3://bucket/x") == "s3://bucket/x" and resolve_clone_source(str(team)) == str(team)
    with pytest.raises(RemoteConfigError, match="your own remotes have no default"):
        add_remote(None, "second", str(other), default=True)
    unknown = shell("stepjournal clone nobody c", tmp_path)
    assert unknown.returncode == 1 and "stepjournal remote add --global nobody URL" in unknown.stderr
    assert not (tmp_path / "c").exists()
    removed = shell("stepjournal remote remove --global team", tmp_path)
    assert removed.returncode == 0 and list_remotes(None) == []
    listed = shell("stepjournal remote list --global", tmp_path)
    assert listed.stdout == "you have no remotes of your own (stepjournal remote add --global NAME URL)\n"


@pytest.mark.parametrize("line, says", [
    ("stepjournal remote add a team /x --global", "--global names your own remotes, not journal a's"),
    ("stepjournal remote list", "give the JOURNAL whose remotes these are, or --global for your own"),
    ("stepjournal remote remove team", "give the JOURNAL whose remotes these are, or --global for your own"),
])
def test_a_remote_verb_needs_a_journal_or_global_but_not_both(tmp_path, line, says):
    done = shell(line, tmp_path, {"XDG_CONFIG_HOME": str(tmp_path / "config")})
    assert done.returncode == 2 and says in done.stderr, done.stderr
