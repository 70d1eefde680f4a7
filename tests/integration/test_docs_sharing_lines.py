"""docs/sharing.md's push, pull, clone, bundle and import lines, typed through a shell as the page shows
them, against a real S3 server (moto on 127.0.0.1). ``JOURNAL`` is the one word filled in: the journal
the line works on (its own folder per machine); ``s3://bucket`` becomes the test's bucket."""

from __future__ import annotations

import torch

from doc_lines import command_lines, run_line
from s3_server import s3_env, s3_server  # noqa: F401  (fixtures)
from stepjournal import Journal

SHARING = "docs/sharing.md"
PUSH_PULL = [line for line in command_lines(SHARING, section="push, pull, clone")
             if line.text.startswith("stepjournal ")][:4]
BUNDLE = [line for line in command_lines(SHARING) if "exp1.bundle" in line.text]
OTHERS = [line for line in command_lines(SHARING) if "theirs.bundle" in line.text or "--keep ours" in line.text]
DOC_LINES = PUSH_PULL + BUNDLE + OTHERS


def record(path, steps, *, run="exp1", scale=1):
    with Journal(str(path), run=run) as journal:
        for step in steps:
            journal.record(step, {"ids": torch.arange(4) * step * scale})


def typed(line, journal, bucket=None):
    """The page's line with JOURNAL (and s3://bucket) filled in; it must end with status 0."""
    text = line.text.replace("JOURNAL", journal)
    return text.replace("s3://bucket", bucket) if bucket else text


def ok(line, cwd, **fill):
    done = run_line(typed(line, **fill), cwd)
    assert done.returncode == 0, (line.text, done.stderr)
    return done


def test_push_clone_pull_and_push_to_the_default_remote_as_the_page_types_them(tmp_path, s3_env):
    push, clone, pull, push_default = PUSH_PULL
    assert [w.text.split()[1] for w in PUSH_PULL] == ["push", "clone", "pull", "push"]
    record(tmp_path / "machine-a", [1, 2])
    ok(push, tmp_path, journal="machine-a", bucket=s3_env)
    ok(clone, tmp_path, journal="machine-b", bucket=s3_env)
    record(tmp_path / "machine-a", [3])
    ok(push, tmp_path, journal="machine-a", bucket=s3_env)
    ok(pull, tmp_path, journal="machine-b", bucket=s3_env)
    with Journal(str(tmp_path / "machine-b"), readonly=True, run="exp1") as journal:
        assert journal.recorded_steps() == [1, 2, 3]
    record(tmp_path / "machine-b", [4], run="exp2")  # machine B's own run, sent to the remote it cloned from
    ok(push_default, tmp_path, journal="machine-b")
    ok(clone, tmp_path, journal="machine-c", bucket=s3_env)
    with Journal(str(tmp_path / "machine-c"), readonly=True, run="exp2") as journal:
        assert journal.recorded_steps() == [4]


def test_export_verify_and_import_a_bundle_as_the_page_types_them(tmp_path):
    export, verify, import_ = BUNDLE
    record(tmp_path / "ours", [1, 2, 3])
    ok(export, tmp_path, journal="ours")
    assert ok(verify, tmp_path, journal="ours").stdout.startswith("bundle is whole: ")
    ok(import_, tmp_path, journal="theirs")  # creates the journal
    with Journal(str(tmp_path / "theirs"), readonly=True, run="exp1") as journal:
        assert journal.recorded_steps() == [1, 2, 3]


def test_import_under_another_run_key_and_pull_keeping_ours_as_the_page_types_them(tmp_path, s3_env):
    import_as, pull_keep = OTHERS
    record(tmp_path / "alice", [1, 2], run="exp")
    assert run_line("stepjournal export alice --bundle theirs.bundle", tmp_path).returncode == 0
    record(tmp_path / "mine", [1], run="exp")
    ok(import_as, tmp_path, journal="mine")
    with Journal(str(tmp_path / "mine"), readonly=True) as journal:
        assert journal.recorded_steps(run="exp-alice") == [1, 2] and journal.recorded_steps(run="exp") == [1]
    record(tmp_path / "remote-side", [1, 2], scale=10)
    assert run_line(f"stepjournal push remote-side {s3_env}/runs/exp1", tmp_path).returncode == 0
    record(tmp_path / "ours", [1], scale=1)
    ok(pull_keep, tmp_path, journal="ours", bucket=s3_env)
    with Journal(str(tmp_path / "ours"), readonly=True, run="exp1") as journal:
        served = journal.load_output(journal.lookup(1))
        assert torch.equal(served["ids"], torch.arange(4))  # our own record still serves step 1
        assert journal.recorded_steps() == [1, 2]
