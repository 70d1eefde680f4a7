"""`FilePayloadStore` passes the payload-store conformance suite, writes durably in the documented order,
reports the files a crash left behind, refuses a full disk with `JournalFullError` (a real tmpfs), and
never serves a file that was changed, truncated or replaced."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from stepjournal.testing import PayloadStoreConformance
from stepjournal.testing import payload_of as payload
from stepjournal.errors import IntegrityError, JournalError, PayloadMissingError
from stepjournal.payloads import decode_payload, encode_payload
from stepjournal.base._digest import digest_bytes  # private: digests as the store computes them
from stepjournal.payloads._file_store import TMP_FOLDER, FilePayloadStore  # private: the file store's layout


class TestFilePayloadStore(PayloadStoreConformance):
    def make_store(self, tmp_path):
        yield FilePayloadStore(str(tmp_path / "payloads"))

    def damage(self, store, digest):
        path = store.path_of(digest)
        data = bytearray(open(path, "rb").read())
        data[-1] ^= 0xFF
        with open(path, "wb") as f:
            f.write(data)


def test_a_payload_is_one_file_named_by_its_digest_and_nothing_is_left_in_tmp(tmp_path):
    store = FilePayloadStore(str(tmp_path / "payloads"))
    digest, raw = payload({"ids": torch.arange(100)})
    store.put(digest, raw)
    name = digest.hex()
    assert open(tmp_path / "payloads" / name[:2] / name[2:], "rb").read() == raw
    assert os.listdir(tmp_path / "payloads" / TMP_FOLDER) == [] and store.partial_files() == []


def test_the_buffers_given_are_written_one_after_another_without_joining_them(tmp_path):
    """``put`` takes the header and the tensors' own buffers as they are (``writev``), the digest of the whole."""
    store = FilePayloadStore(str(tmp_path / "payloads"))
    raw = bytes(encode_payload({"a": torch.arange(70_000), "b": "x" * 5000}))
    parts = [raw[:7], memoryview(raw)[7:300_001], np.frombuffer(raw[300_001:], dtype=np.uint8), b""]
    digest = digest_bytes(raw)
    store.put(digest, parts)
    assert store.get(digest) == raw
    assert torch.equal(decode_payload(store.get(digest))["a"], torch.arange(70_000))


def test_a_read_hands_the_load_a_private_mapping_of_the_file_so_tensors_are_views_of_it(tmp_path):
    from stepjournal.base._pages import HANDED_OVER  # private: page release under test

    store = FilePayloadStore(str(tmp_path / "payloads"))
    digest, raw = payload({"ids": torch.arange(300_000)})
    store.put(digest, raw)
    with store.view(digest, nbytes=len(raw)) as (got, release):
        assert release is HANDED_OVER and not memoryview(got).readonly and bytes(got) == raw


def test_a_file_changed_truncated_or_replaced_on_disk_is_never_served(tmp_path):
    store = FilePayloadStore(str(tmp_path / "payloads"))
    digest, raw = payload({"ids": torch.arange(5000)})
    other_digest, other = payload({"ids": torch.arange(5000) + 1})
    path = store.path_of(digest)

    def rewrite(data):
        os.chmod(path, 0o644)
        with open(path, "wb") as f:
            f.write(data)

    for name, data in [("changed", raw[:-1] + bytes([raw[-1] ^ 1])), ("truncated", raw[: len(raw) // 2]),
                       ("replaced", other), ("emptied", b""), ("grown", raw + b"\0" * 4096)]:
        store.put(digest, raw)
        rewrite(data)
        with pytest.raises(IntegrityError) as caught:
            store.get(digest, nbytes=len(raw))
        assert not isinstance(caught.value, PayloadMissingError), name
        with pytest.raises(IntegrityError):
            store.check(digest, nbytes=len(raw))
        os.unlink(path)
    assert other_digest not in store


def test_a_file_larger_than_its_payload_may_be_is_not_read(tmp_path):
    store = FilePayloadStore(str(tmp_path / "payloads"))
    digest, raw = payload({"ids": torch.arange(100)})
    store.put(digest, raw)
    with open(store.path_of(digest), "ab") as f:
        f.truncate(8 << 20)  # sparse: 8 MiB claimed, nothing written
    with pytest.raises(IntegrityError, match="more than a payload of"):
        store.get(digest, nbytes=len(raw))


def test_a_readonly_store_reads_and_refuses_every_write(tmp_path):
    digest, raw = payload({"ids": torch.arange(10)})
    FilePayloadStore(str(tmp_path / "payloads")).put(digest, raw)
    reader = FilePayloadStore(str(tmp_path / "payloads"), readonly=True)
    assert reader.get(digest) == raw
    for write in (lambda: reader.put(digest, raw), lambda: reader.delete(digest), reader.remove_partial_files):
        with pytest.raises(JournalError, match="read-only"):
            write()


# -- a crash between the file and its event --------------------------------------------------------------
KILLED_WRITER = """
    import os, signal, stat, sys
    import torch
    from stepjournal.payloads import encode_payload
    from stepjournal.base._digest import digest_bytes
    from stepjournal.payloads._file_store import FilePayloadStore
    import stepjournal.payloads._file_store as files

    folder, where = sys.argv[1], sys.argv[2]
    raw = bytes(encode_payload({"ids": torch.arange(200_000)}))
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):  # a regular file's fsync is the new payload file's: die right after it, before the rename
        real_fsync(fd)
        if where == "before-rename" and stat.S_ISREG(os.fstat(fd).st_mode):
            os.kill(os.getpid(), signal.SIGKILL)

    def rename(a, b, **folders):  # the names are relative to the folders' descriptors
        real_rename(a, b, **folders)
        if where == "after-rename":
            os.kill(os.getpid(), signal.SIGKILL)

    files.os.fsync, files.os.rename = fsync, rename
    FilePayloadStore(folder).commit([(digest_bytes(raw), raw)], lambda in_txn: print("event committed"))
"""


@pytest.mark.parametrize("where", ["before-rename", "after-rename"])
def test_a_writer_killed_between_the_file_and_its_event_leaves_an_orphan_never_a_partial_payload(tmp_path, where):
    """SIGKILL at an observed point of the write (the file's fsync, its rename): the event never committed;
    what is left is a file in tmp/ (reported, removable) or a whole payload, never a partial one under a digest."""
    folder = str(tmp_path / "payloads")
    killed = subprocess.run([sys.executable, "-c", textwrap.dedent(KILLED_WRITER), folder, where],
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9 and "event committed" not in killed.stdout, killed.stderr
    store = FilePayloadStore(folder)
    digest, raw = payload({"ids": torch.arange(200_000)})
    if where == "before-rename":
        assert list(store.digests()) == [] and len(store.partial_files()) == 1
        assert store.remove_partial_files() == 1 and store.partial_files() == []
    else:
        assert list(store.digests()) == [digest] and store.partial_files() == []
        store.check(digest, nbytes=len(raw))
    store.put(digest, raw)  # the next write of it succeeds either way
    assert store.get(digest) == raw


# -- a full disk (a real tmpfs in a private mount namespace) ----------------------------------------------
FILL_THEN_WRITE = """
    import os, sys
    import torch
    from stepjournal.errors import JournalFullError
    from stepjournal.payloads import encode_payload
    from stepjournal.base._digest import digest_bytes
    from stepjournal.payloads._file_store import FilePayloadStore

    folder = sys.argv[1]
    store = FilePayloadStore(folder)
    small = bytes(encode_payload({"ids": torch.arange(10)}))
    store.put(digest_bytes(small), small)
    big = bytes(encode_payload({"ids": torch.arange(1 << 20)}))  # 8 MiB on a 4 MiB disk
    try:
        store.put(digest_bytes(big), big)
        print("written")
    except JournalFullError as exc:
        print("JournalFullError", exc)
    print("tmp", os.listdir(os.path.join(folder, "tmp")))
    print("still reads", store.get(digest_bytes(small)) == small, list(store.digests()) == [digest_bytes(small)])
"""


def test_a_full_disk_is_journal_full_error_and_leaves_no_partial_file(tmp_path):
    where = tmp_path / "mnt"
    where.mkdir()
    script = f"{shlex.quote(sys.executable)} -c {shlex.quote(textwrap.dedent(FILL_THEN_WRITE))}"
    result = subprocess.run(["unshare", "-rm", "sh", "-c",
                             f"mount -t tmpfs -o size=4m tmpfs {where} && {script} {where / 'payloads'}"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, (result.returncode, result.stderr)
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("JournalFullError ") and str(where / "payloads") in lines[0], result.stdout
    assert lines[1:] == ["tmp []", "still reads True True"]


def test_what_push_and_a_bundle_send_is_a_read_only_mapping_of_the_file_not_a_copy(tmp_path):
    import mmap

    store = FilePayloadStore(str(tmp_path / "payloads"))
    digest, raw = payload({"ids": torch.arange(300_000)})
    store.put(digest, raw)
    sent = store.stored(digest)
    assert isinstance(sent, mmap.mmap) and sent[:] == raw
    with pytest.raises(TypeError):
        sent[0] = 0  # read-only: a push cannot change the file
    assert store.stored(bytes(32)) is None
