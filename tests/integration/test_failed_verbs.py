"""A failed verb leaves nothing: a `clone`, a `pull` into a new folder or an `import` into a new folder
that fails removes the journal folder it created (never a folder that was there, nor what it held),
a read creates nothing on a ``file://`` remote, and the corrected command then works."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest
import torch

from s3_server import s3_env, s3_server, subprocess_env  # noqa: F401  (fixtures)
from stepjournal import Journal
from stepjournal.errors import IntegrityError, RemoteError, StepJournalError
from stepjournal.events import GenerationRecorded
from stepjournal.sharing import clone, export_bundle, import_bundle, pull, push
from stepjournal.sharing._remote import journal_id  # private: the remote layout

BIN = os.path.dirname(sys.executable)


def record(path, *, run="exp", steps=(1, 2, 3)):
    with Journal(str(path), run=run) as journal:
        for step in steps:
            journal.record(step, {"ids": torch.arange(8) * step, "run": run})


def steps_of(path):
    with Journal(str(path), readonly=True) as journal:
        return sorted((r.run, r.step) for r in journal.audit())


def shell(line, env=None):
    return subprocess.run(["bash", "-c", f"export PATH={BIN}:$PATH; {line}"], capture_output=True, text=True,
                          env=env, timeout=300)


def flip_last_byte(path):
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


# -- clone and pull ----------------------------------------------------------------------------------
def test_a_clone_from_a_wrong_url_leaves_no_folder_and_the_corrected_clone_works(tmp_path, s3_env):
    record(tmp_path / "a")
    push(str(tmp_path / "a"), s3_env + "/exp")
    target = tmp_path / "new" / "journal"  # its parent is created by the clone too
    with pytest.raises(RemoteError, match="no stepjournal remote"):
        clone(s3_env + "/typo", target)
    assert not (tmp_path / "new").exists()
    with pytest.raises(RemoteError, match="no stepjournal remote"):
        pull(s3_env + "/typo", str(target))
    assert not (tmp_path / "new").exists()
    assert clone(s3_env + "/exp", target).events_pulled == 4
    assert steps_of(target) == [("exp", 1), ("exp", 2), ("exp", 3)]


def test_a_read_never_creates_a_missing_file_remote_folder(tmp_path):
    record(tmp_path / "a")
    remote = tmp_path / "remote" / "exp"
    url = remote.as_uri()
    for verb in (lambda: clone(url, tmp_path / "b"), lambda: pull(url, str(tmp_path / "b")),
                 lambda: pull(url, str(tmp_path / "a"))):
        with pytest.raises(RemoteError, match="that folder does not exist"):
            verb()
    assert not (tmp_path / "remote").exists() and not (tmp_path / "b").exists()
    push(str(tmp_path / "a"), url)  # a write creates it
    assert clone(url, tmp_path / "b").events_pulled == 4


def test_a_failed_clone_into_an_empty_folder_given_leaves_it_there_and_empty(tmp_path):
    (tmp_path / "b").mkdir()
    with pytest.raises(RemoteError):
        clone((tmp_path / "missing").as_uri(), tmp_path / "b")
    assert os.listdir(tmp_path / "b") == []


def test_a_clone_into_a_dangling_link_is_refused_and_creates_nothing_where_it_points(tmp_path):
    """A link to nowhere at the target is not a missing folder: the clone would make the journal where the link
    points, and its undo (which removes only what it finds it created) would leave it there when it fails."""
    os.symlink(tmp_path / "elsewhere", tmp_path / "b")
    with pytest.raises(StepJournalError, match="exists and is not an empty folder"):
        clone((tmp_path / "missing").as_uri(), tmp_path / "b")
    assert not os.path.lexists(tmp_path / "elsewhere")


def test_a_failed_pull_into_an_existing_journal_keeps_it_whole(tmp_path):
    record(tmp_path / "a")
    before = sorted(os.listdir(tmp_path / "a"))
    with pytest.raises(RemoteError):
        pull((tmp_path / "missing").as_uri(), str(tmp_path / "a"))
    assert sorted(os.listdir(tmp_path / "a")) == before and len(steps_of(tmp_path / "a")) == 3


def test_a_clone_damaged_after_some_runs_were_committed_removes_the_new_folder(tmp_path):
    """A new folder holding part of a remote is not a clone of it; an existing journal keeps the runs
    committed before the damage, and the error names the steps that were not pulled."""
    record(tmp_path / "a")
    remote = tmp_path / "remote"
    push(str(tmp_path / "a"), remote.as_uri(), segment_events=1)  # one run per event
    with Journal(str(tmp_path / "a"), readonly=True, run="exp") as journal:
        flip_last_byte(remote / "payloads" / journal.lookup(3).event.output.digest)
    with pytest.raises(IntegrityError, match=r"affected steps \[3\]"):
        clone(remote.as_uri(), tmp_path / "b")
    assert not (tmp_path / "b").exists()
    Journal(str(tmp_path / "b")).close()
    with pytest.raises(IntegrityError, match=r"affected steps \[3\].*were not pulled"):
        pull(remote.as_uri(), str(tmp_path / "b"))
    assert steps_of(tmp_path / "b") == [("exp", 1), ("exp", 2)]


# -- import ------------------------------------------------------------------------------------------
def two_journal_bundle(tmp_path):
    """A bundle of two journals' events (each one run); returns it and the later-imported journal's path."""
    record(tmp_path / "x", run="x")
    record(tmp_path / "y", run="y")
    for name in ("x", "y"):
        export_bundle(str(tmp_path / name), tmp_path / f"{name}.bundle")
        import_bundle(tmp_path / f"{name}.bundle", str(tmp_path / "both"))
    export_bundle(str(tmp_path / "both"), tmp_path / "both.bundle")
    ids = {}
    for name in ("x", "y"):
        with Journal(str(tmp_path / name), readonly=True) as journal:
            ids[journal_id(journal)] = name
    return tmp_path / "both.bundle", ids[max(ids)]  # sources are imported in the order of their ids


def damaged_later(tmp_path):
    """The two-journal bundle with a payload of the journal imported second damaged; (bundle, damaged run)."""
    bundle, later = two_journal_bundle(tmp_path)
    with Journal(str(tmp_path / later), readonly=True) as journal:
        digest = next(e.output.digest for _s, e in journal.events(types=[GenerationRecorded]))
    damaged = tmp_path / "damaged.bundle"
    with zipfile.ZipFile(bundle) as src, zipfile.ZipFile(damaged, "w", compression=zipfile.ZIP_STORED) as out:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == f"payloads/{digest}":
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            out.writestr(info.filename, data)
    return damaged, later


def test_an_import_of_a_file_that_is_not_a_bundle_leaves_no_folder(tmp_path):
    (tmp_path / "notes.txt").write_text("not a bundle")
    zipfile.ZipFile(tmp_path / "empty.zip", "w").close()
    for path in (tmp_path / "notes.txt", tmp_path / "empty.zip", tmp_path / "absent.bundle"):
        with pytest.raises(StepJournalError):
            import_bundle(path, str(tmp_path / "b"))
        assert not (tmp_path / "b").exists()


def test_an_import_damaged_in_a_later_segment_removes_the_new_folder_and_keeps_an_existing_journals_runs(tmp_path):
    damaged, later = damaged_later(tmp_path)
    earlier = ({"x", "y"} - {later}).pop()
    with pytest.raises(IntegrityError, match="affected steps"):
        import_bundle(damaged, str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()
    record(tmp_path / "mine", run="mine", steps=(1,))
    with pytest.raises(IntegrityError, match="affected steps.*were not pulled"):
        import_bundle(damaged, str(tmp_path / "mine"))
    assert steps_of(tmp_path / "mine") == [("mine", 1)] + [(earlier, s) for s in (1, 2, 3)]


# -- the command line, typed in a shell -------------------------------------------------------------
def test_each_failed_verb_typed_in_a_shell_leaves_nothing_and_the_corrected_one_works(tmp_path, s3_env, s3_server):
    record(tmp_path / "a")
    env = subprocess_env(s3_server)
    damaged, _later = damaged_later(tmp_path)
    (tmp_path / "notes.txt").write_text("not a bundle")
    remote, missing = tmp_path / "remote", tmp_path / "missing" / "remote"
    failed = {
        "wrong s3 url": shell(f"stepjournal clone {s3_env}/typo {tmp_path / 'b1'}", env),
        "missing remote folder": shell(f"stepjournal clone {missing.as_uri()} {tmp_path / 'b2'}", env),
        "pull into a new folder": shell(f"stepjournal pull {missing.as_uri()} {tmp_path / 'b3'}", env),
        "not a bundle": shell(f"stepjournal import {tmp_path / 'notes.txt'} {tmp_path / 'b4'}", env),
        "damaged bundle": shell(f"stepjournal import {damaged} {tmp_path / 'b5'}", env),
    }
    assert {k: r.returncode for k, r in failed.items()} == dict.fromkeys(failed, 1)
    assert "that folder does not exist" in failed["missing remote folder"].stderr
    assert f"stepjournal verify {damaged}" in failed["damaged bundle"].stderr  # the bundle, not a removed journal
    assert sorted(os.listdir(tmp_path)) == sorted(["a", "x", "y", "both", "x.bundle", "y.bundle", "both.bundle",
                                                   "damaged.bundle", "notes.txt"])
    fixed = [shell(f"stepjournal push {tmp_path / 'a'} {s3_env}/exp && stepjournal clone {s3_env}/exp {tmp_path / 'b1'}",
                   env),
             shell(f"stepjournal push {tmp_path / 'a'} {remote.as_uri()} && "
                   f"stepjournal clone {remote.as_uri()} {tmp_path / 'b2'} && "
                   f"stepjournal pull {remote.as_uri()} {tmp_path / 'b3'}", env),
             shell(f"stepjournal import {tmp_path / 'both.bundle'} {tmp_path / 'b5'}", env)]
    assert [r.returncode for r in fixed] == [0, 0, 0], [r.stderr for r in fixed]
    assert steps_of(tmp_path / "b1") == steps_of(tmp_path / "b2") == steps_of(tmp_path / "b3") == steps_of(tmp_path / "a")
    assert {run for run, _step in steps_of(tmp_path / "b5")} == {"x", "y"}
