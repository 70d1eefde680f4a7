"""A journal keeps payloads of `FILE_FROM` bytes and more as files in its ``payloads/`` folder: recorded,
replayed, released, verified, compacted, pushed, pulled and bundled as its LMDB payloads are; a writer
killed between a file and its event loses nothing acknowledged and leaves only what verify names and
compact removes."""

from __future__ import annotations

import asyncio

import os
import subprocess
import sys
import textwrap

import lmdb
import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import IntegrityError
from stepjournal.sharing import clone, export_bundle, import_bundle, push
from stepjournal.upkeep import Retention, compact, prune
from stepjournal.payloads import encode_payload
from stepjournal.base._digest import digest_bytes  # private: digests as the store computes them
from stepjournal.payloads._file_store import (  # private: the file store's layout
    PAYLOAD_FOLDER, TMP_FOLDER, FilePayloadStore,
)
from stepjournal.payloads._payload_store import FILE_FROM  # private: the store's internals

BIG = FILE_FROM // 8 + 4096  # int64: just over FILE_FROM encoded


def big(step: int) -> dict:
    return {"ids": torch.arange(BIG) + step, "step": step}


def small(step: int) -> dict:
    return {"ids": torch.arange(10) + step}


def files_of(path) -> list:
    root = os.path.join(path, PAYLOAD_FOLDER)
    return sorted(fan + name for fan in os.listdir(root) if fan != TMP_FOLDER
                  for name in os.listdir(os.path.join(root, fan))) if os.path.isdir(root) else []


def lmdb_digests(path) -> list:
    env = lmdb.open(str(path), readonly=True, lock=False, max_dbs=8, subdir=True)
    try:
        with env.begin() as txn:
            return sorted(bytes(k).hex() for k, _ in txn.cursor(db=env.open_db(b"payloads", txn=txn, create=False)))
    finally:
        env.close()


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k]
                                        for k in a)


def test_a_large_payload_is_a_file_a_small_one_rides_in_lmdb_and_both_replay_from_a_new_handle(tmp_path):
    path = tmp_path / "j"
    with Journal(path) as journal:
        large = journal.record(1, big(1)).event.output.digest
        little = journal.record(2, small(2)).event.output.digest
    assert files_of(path) == [large] and little in lmdb_digests(path) and large not in lmdb_digests(path)
    with Journal(path, readonly=True) as journal:
        assert same(journal.load_output(journal.lookup(1)), big(1))
        assert same(journal.load_output(journal.lookup(2)), small(2))
        assert journal.verify() == []


def test_the_size_cap_counts_payload_files_and_a_record_past_it_is_journal_full_error(tmp_path):
    from stepjournal.errors import JournalFullError

    path = tmp_path / "j"
    cap = 4 * FILE_FROM
    with Journal(path, max_size=cap) as journal:
        recorded = []
        with pytest.raises(JournalFullError, match=f"size cap of {cap} bytes"):
            for step in range(1, 20):
                journal.record(step, big(step))
                recorded.append(step)
        assert 2 <= len(recorded) < 6 and journal.recorded_steps() == recorded and journal.verify() == []
        assert tmp_files(path) == []  # the refused record's file, written while it was hashed, is gone
    on_disk = sum(os.path.getsize(os.path.join(d, n)) for d, _, names in os.walk(path) for n in names if n != "lock.mdb")
    assert on_disk <= cap


def test_a_damaged_payload_file_is_reported_with_its_step_and_never_replayed(tmp_path):
    path = tmp_path / "j"
    with Journal(path) as journal:
        digest = journal.record(3, big(3)).event.output.digest
    target = os.path.join(path, PAYLOAD_FOLDER, digest[:2], digest[2:])
    data = bytearray(open(target, "rb").read())
    data[len(data) // 2] ^= 1
    with open(target, "wb") as f:
        f.write(data)
    with Journal(path, readonly=True) as journal:
        assert [(p.kind, p.where, p.steps) for p in journal.verify()] == [("payload", digest, (3,))]
        with pytest.raises(IntegrityError, match="does not match its digest"):
            journal.load_output(journal.lookup(3))


def tmp_files(path) -> list:
    tmp = os.path.join(path, PAYLOAD_FOLDER, TMP_FOLDER)
    return sorted(os.listdir(tmp)) if os.path.isdir(tmp) else []


def test_a_large_payload_is_written_while_it_is_hashed_and_put_in_place_by_its_record(tmp_path, monkeypatch):
    """`prepare(copy=False)` (as `record` and the engine prepare) starts the file before the digest is
    known; the record renames it into place and never writes the bytes a second time."""
    import gc

    written_at_commit = []
    real_write = FilePayloadStore._write
    monkeypatch.setattr(FilePayloadStore, "_write", lambda self, at, buffers: (written_at_commit.append(at),
                                                                                real_write(self, at, buffers)))
    path = tmp_path / "j"
    with Journal(path) as journal:
        prepared = journal.prepare(big(1), copy=False)
        journal.record(1, prepared)
        assert written_at_commit == [] and tmp_files(path) == [] and files_of(path) == [prepared.digest]
        dropped = journal.prepare(big(2), copy=False)  # never recorded: its file goes with it
        del dropped
        gc.collect()  # the finalizer waits for the file's thread, then removes the file
        assert tmp_files(path) == [] and files_of(path) == [prepared.digest]
        assert same(journal.load_output(journal.lookup(1)), big(1)) and journal.verify() == []
        journal.record(2, big(2))  # record's own prepare stages too
        assert written_at_commit == [] and len(files_of(path)) == 2 and tmp_files(path) == []
        asyncio.run(journal.arecord(3, big(3)))  # and arecord's: its staged file lives until its commit
        assert written_at_commit == [] and len(files_of(path)) == 3 and tmp_files(path) == []


def _mapped_from(address: int, path: str) -> bool:
    """True when `address` lies in a private (copy-on-write) mapping of the file `path` in this process."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].rstrip("\n") == os.path.realpath(path):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= address < end:
                    return fields[1][3] == "p"
    return False


def test_a_replayed_tensor_is_a_copy_on_write_view_of_its_file_that_outlives_its_removal(tmp_path):
    path = tmp_path / "j"
    with Journal(path) as journal:
        digest = journal.record(1, big(1)).event.output.digest
    target = os.path.join(path, PAYLOAD_FOLDER, digest[:2], digest[2:])
    with Journal(path, readonly=True) as journal:
        ids = journal.load_output(journal.lookup(1))["ids"]
    assert _mapped_from(ids.data_ptr(), target), "the tensor is a view of the file's mapping, not a copy"
    ids += 1  # a trainer writing into its batch changes its own pages only
    assert digest_bytes(open(target, "rb").read()).hex() == digest
    with Journal(path, readonly=True) as journal:
        assert same(journal.load_output(journal.lookup(1)), big(1))
    os.unlink(target)  # retention or compact removing the file while the tensor lives
    assert torch.equal(ids, big(1)["ids"] + 1)


def test_a_file_cut_short_is_refused_by_its_size_before_it_is_mapped(tmp_path):
    path = tmp_path / "j"
    with Journal(path) as journal:
        digest = journal.record(2, big(2)).event.output.digest
    target = os.path.join(path, PAYLOAD_FOLDER, digest[:2], digest[2:])
    os.chmod(target, 0o644)
    with open(target, "r+b") as f:
        f.truncate(os.path.getsize(target) - 4096)
    with Journal(path, readonly=True) as journal:
        with pytest.raises(IntegrityError, match=r"its event says \d+: the file was cut short or grown; not served"):
            journal.load_output(journal.lookup(2))
        assert [(p.kind, p.steps) for p in journal.verify()] == [("payload", (2,))]


def test_retention_deletes_a_released_payload_file_once_its_release_commits(tmp_path):
    path = tmp_path / "j"
    with Journal(path) as journal:
        digests = [journal.record(step, big(step)).event.output.digest for step in (1, 2, 3)]
        plan = prune(journal, Retention(keep_last=1))
        assert [r.step for r in plan.releases] == [1, 2]
        assert files_of(path) == [digests[2]]
        assert journal.verify() == []
    with Journal(path, retention=Retention(keep_last=1)) as journal:  # retention while recording, too
        kept = journal.record(4, big(4)).event.output.digest
    assert files_of(path) == [kept]


def test_verify_names_an_orphan_and_a_half_written_file_and_compact_removes_them(tmp_path):
    path = tmp_path / "j"
    with Journal(path) as journal:
        kept = journal.record(1, big(1)).event.output.digest
    root = os.path.join(path, PAYLOAD_FOLDER)
    raw = bytes(encode_payload(big(2)))  # a whole payload whose event never committed
    orphan = digest_bytes(raw).hex()
    FilePayloadStore(root).put(bytes.fromhex(orphan), raw)
    with open(os.path.join(root, TMP_FOLDER, "cut-short"), "wb") as f:
        f.write(b"half")
    with Journal(path, readonly=True) as journal:
        found = [(p.kind, os.path.basename(p.where)) for p in journal.verify()]
    assert found == [("orphan_file", orphan), ("partial_file", "cut-short")]
    assert compact(path).files_removed == 2
    assert files_of(path) == [kept] and os.listdir(os.path.join(root, TMP_FOLDER)) == []
    with Journal(path, readonly=True) as journal:
        assert journal.verify() == [] and same(journal.load_output(journal.lookup(1)), big(1))


def test_compact_to_a_new_folder_takes_the_payload_files_the_events_name(tmp_path):
    with Journal(tmp_path / "j") as journal:
        journal.record(1, big(1))
        journal.record(2, small(2))
    compact(tmp_path / "j", to=tmp_path / "copy")
    with Journal(tmp_path / "copy", readonly=True) as journal:
        assert journal.verify() == []
        assert same(journal.load_output(journal.lookup(1)), big(1)) and same(journal.load_output(journal.lookup(2)), small(2))


def test_push_clone_and_a_bundle_carry_payload_files_and_land_them_as_files(tmp_path):
    with Journal(tmp_path / "a") as journal:
        digest = journal.record(1, big(1)).event.output.digest
        journal.record(2, small(2))
    push(str(tmp_path / "a"), str(tmp_path / "remote"))
    clone(str(tmp_path / "remote"), str(tmp_path / "b"))
    export_bundle(str(tmp_path / "a"), str(tmp_path / "a.stepjournal"))
    import_bundle(str(tmp_path / "a.stepjournal"), str(tmp_path / "c"))
    for name in ("b", "c"):
        assert files_of(tmp_path / name) == [digest]
        with Journal(tmp_path / name, readonly=True) as journal:
            assert journal.verify() == []
            assert same(journal.load_output(journal.lookup(1)), big(1)) and same(journal.load_output(journal.lookup(2)), small(2))


# -- a writer killed between a payload file and its event -----------------------------------------------
KILLED_RECORD = """
    import os, signal, stat, sys
    import torch
    import stepjournal.payloads._file_store as files
    from stepjournal import Journal

    path, point, big = sys.argv[1], sys.argv[2], int(sys.argv[3])
    real_fsync, real_rename = os.fsync, os.rename
    renamed = []

    def fsync(fd):
        real_fsync(fd)
        if point == "file-synced" and stat.S_ISREG(os.fstat(fd).st_mode):
            os.kill(os.getpid(), signal.SIGKILL)
        if point == "folder-synced" and stat.S_ISDIR(os.fstat(fd).st_mode) and renamed:  # the renamed file's folder
            os.kill(os.getpid(), signal.SIGKILL)

    def rename(a, b, **folders):  # the names are relative to the folders' descriptors
        real_rename(a, b, **folders)
        renamed.append(b)
        if point == "renamed":
            os.kill(os.getpid(), signal.SIGKILL)

    with Journal(path) as journal:
        journal.record(1, {"ids": torch.arange(big) + 1, "step": 1})
        print("acknowledged 1", flush=True)
        files.os.fsync, files.os.rename = fsync, rename
        journal.record(2, {"ids": torch.arange(big) + 2, "step": 2})
        print("acknowledged 2", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)  # "committed": killed after the record returned
"""


@pytest.mark.parametrize("point", ["file-synced", "renamed", "folder-synced", "committed"])
def test_a_record_killed_at_each_point_of_its_file_write_loses_nothing_acknowledged(tmp_path, point):
    """SIGKILL at an observed point (the new file's fsync, its rename, the folder's fsync, the record's
    return): the acknowledged records replay; no event names a missing or partial file; what is left
    over is reported by verify and removed by compact."""
    path = tmp_path / "j"
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED_RECORD), str(path), point, str(BIG)],
                            capture_output=True, text=True, timeout=300)
    assert killed.returncode == -9, killed.stderr
    acknowledged = [int(line.split()[1]) for line in killed.stdout.split("\n") if line.startswith("acknowledged")]
    assert acknowledged == ([1, 2] if point == "committed" else [1])
    with Journal(path, readonly=True) as journal:
        assert journal.recorded_steps() == acknowledged
        for step in acknowledged:
            assert same(journal.load_output(journal.lookup(step)), big(step))
        kinds = sorted(p.kind for p in journal.verify())
    assert kinds == {"file-synced": ["partial_file"], "renamed": ["orphan_file"], "folder-synced": ["orphan_file"],
                     "committed": []}[point]
    compact(path)
    with Journal(path) as journal:
        assert journal.verify() == []
        journal.record(2, big(2))  # the step records again, its file written anew
        assert same(journal.load_output(journal.lookup(2)), big(2)) and journal.verify() == []
