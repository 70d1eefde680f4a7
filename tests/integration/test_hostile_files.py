"""Hostile journal files: crafted LMDB pages and files that are not what they seem.

A journal handed over by someone else may be built to crash or abuse the reader. LMDB trusts its own
pages, so stepjournal walks data.mdb's structure before LMDB reads it (journal/storage/_lmdb_check.py), and
refuses LMDB files that are links, special files or someone else's before LMDB opens them. Every
crafted file here is read by the real CLI in a subprocess: it must exit with a clean error, never a
signal or a traceback.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import IntegrityError, UnsafePathError
from stepjournal.storage._lmdb_check import check_data_file  # private: the LMDB file checks under test

import lmdb_pages as pages
from cli_support import run_cli as _cli

RUN = "hostile"


def _build(path: str, steps: int = 300) -> None:
    """Enough events for a two-level events tree; 6 KB outputs, so each payload is an overflow value."""
    with Journal(path, run=RUN, fingerprint={"model": "m"}, sync=False) as journal:
        for step in range(steps):
            journal.record(step, {"ids": torch.full((750,), step, dtype=torch.int64)}, input={"p": step})


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("template") / "journal")
    _build(path)
    return path


@pytest.fixture
def journal(template, tmp_path) -> str:
    path = str(tmp_path / "journal")
    shutil.copytree(template, path)
    return path


def _refused_cleanly(path: str, expected: str, commands=(["verify"],)) -> None:
    """Each CLI command exits with one error line naming the journal; `Journal` raises `IntegrityError`."""
    for command in ([*c, path] for c in commands):
        done = _cli(*command)
        assert done.returncode in (1, 2), f"{command[0]} exited {done.returncode}: {done.stderr[-2000:]}"
        assert "Traceback" not in done.stderr and expected in done.stderr and path in done.stderr, done.stderr
    for readonly in (True, False):
        with pytest.raises(IntegrityError, match=re.escape(expected)):
            Journal(path, readonly=readonly)


def _raw_reader_signal(path: str) -> int:
    """Read every payload with py-lmdb alone, in a child; its exit status (negative: killed by a signal)."""
    code = (
        "import lmdb, sys\n"
        "env = lmdb.open(sys.argv[1], max_dbs=8, readonly=True, lock=False)\n"
        "db = env.open_db(b'payloads', create=False)\n"
        "with env.begin(db=db) as txn:\n"
        "    print(sum(len(v) for _, v in txn.cursor()))\n"
    )
    return subprocess.run([sys.executable, "-c", code, path], capture_output=True, timeout=120).returncode


def _raw_reader_events(path: str) -> int:
    """Count the event log's entries with py-lmdb alone, in a child (it exits 0)."""
    code = (
        "import lmdb, sys\n"
        "env = lmdb.open(sys.argv[1], max_dbs=8, readonly=True, lock=False)\n"
        "db = env.open_db(b'events', create=False)\n"
        "with env.begin(db=db) as txn:\n"
        "    print(sum(1 for _ in txn.cursor()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def _data(path: str) -> str:
    return os.path.join(path, "data.mdb")


# -- point 2: crafted pages -----------------------------------------------------------------------
def test_an_overflow_value_claiming_256_mib_past_the_end_of_the_file_is_refused_not_a_sigbus(journal):
    data = pages.read(_data(journal))
    leaf = pages.first_leaf(data, pages.named_dbs(data)["payloads"])
    node = next(n for n in pages.nodes(data, leaf) if n.flags & pages.F_BIGDATA)
    pages.patch(_data(journal), node.at, "<HH", 0, (256 << 20) >> 16)  # dsize = 256 MiB
    assert _raw_reader_signal(journal) == -7  # the attack is real: LMDB alone dies of SIGBUS
    _refused_cleanly(journal, "claims 268435456 bytes", (["verify"], ["runs", "--json"], ["audit", "--json"]))


def test_a_branch_child_beyond_the_end_of_the_file_is_refused(journal):
    data = pages.read(_data(journal))
    events = pages.named_dbs(data)["events"]
    assert events.depth >= 2
    last = pages.nodes(data, events.root)[-1]
    beyond = os.path.getsize(_data(journal)) // pages.page_size(data) + 1000
    pages.patch(_data(journal), last.at, "<HHH", beyond & 0xFFFF, beyond >> 16 & 0xFFFF, beyond >> 32)
    _refused_cleanly(journal, f"points at page {beyond}")


def test_an_emptied_leaf_of_the_event_log_is_refused_not_read_as_a_log_with_a_hole(journal):
    data = pages.read(_data(journal))
    events = pages.named_dbs(data)["events"]
    leaf = pages.first_leaf(data, events)
    assert events.depth >= 2 and pages.nodes(data, leaf)
    before = _raw_reader_events(journal)
    pages.patch(_data(journal), leaf * pages.page_size(data) + 12, "<H", pages.PAGEHDR)  # mp_lower: no nodes
    # The attack is real: LMDB alone reads on past the hole, the leaf's events gone without a word.
    assert _raw_reader_events(journal) < before
    _refused_cleanly(journal, f"leaf page {leaf} of database 'events' holds no entries",
                     (["verify"], ["audit", "--json"], ["audit", "--no-pager"]))


def test_a_page_number_cycle_is_refused(journal):
    data = pages.read(_data(journal))
    events = pages.named_dbs(data)["events"]
    first = pages.nodes(data, events.root)[0]
    root = events.root
    pages.patch(_data(journal), first.at, "<HHH", root & 0xFFFF, root >> 16 & 0xFFFF, root >> 32)  # root -> root
    _refused_cleanly(journal, "a second time (a cycle)")


def test_an_overflow_value_pointing_into_a_tree_page_is_refused(journal):
    data = pages.read(_data(journal))
    dbs = pages.named_dbs(data)
    leaf = pages.first_leaf(data, dbs["payloads"])
    node = next(n for n in pages.nodes(data, leaf) if n.flags & pages.F_BIGDATA)
    pages.patch(_data(journal), node.data_at, "<Q", dbs["events"].root)
    _refused_cleanly(journal, "which is not an overflow page")


def test_a_meta_page_whose_database_root_lies_past_the_end_of_the_file_is_refused(journal):
    data = pages.read(_data(journal))
    main = pages.main_db(data)
    beyond = os.path.getsize(_data(journal)) // pages.page_size(data) + 7
    pages.patch(_data(journal), main.record_at + 40, "<Q", beyond)
    _refused_cleanly(journal, f"points at page {beyond}")


def test_a_meta_page_whose_last_page_lies_past_the_end_of_the_file_is_refused(journal):
    data = pages.read(_data(journal))
    pages.patch(_data(journal), pages.newest_meta(data) + 120, "<Q", len(data) // pages.page_size(data) + 50)
    _refused_cleanly(journal, "truncated")


@pytest.mark.parametrize("keep", [100, 8192, 0.5])
def test_a_truncated_file_is_refused(journal, keep):
    size = os.path.getsize(_data(journal))
    with open(_data(journal), "r+b") as fh:
        fh.truncate(int(size * keep) if isinstance(keep, float) else keep)
    for command in (["verify", journal], ["audit", "--json", journal]):
        done = _cli(*command)
        assert done.returncode in (1, 2) and "Traceback" not in done.stderr and journal in done.stderr, done.stderr


def test_an_intact_journal_passes_the_check_and_every_tree_page_is_read_once(journal):
    stats = check_data_file(_data(journal))
    assert stats.overflow_values == 300  # the outputs (the inputs are small enough to sit in their leaves)
    assert stats.tree_pages > 20
    done = _cli("verify", "--json", journal)
    assert done.returncode == 0 and json.loads(done.stdout)["problems"] == []


# -- point 3: LMDB files that are not plain files of this user -------------------------------------
@pytest.mark.parametrize("readonly", [True, False])
def test_a_hard_linked_lock_file_is_refused_before_lmdb_writes_it(journal, tmp_path, readonly):
    victim = tmp_path / "victim"
    victim.write_bytes(b"x" * 32)
    os.unlink(os.path.join(journal, "lock.mdb"))
    os.link(victim, os.path.join(journal, "lock.mdb"))
    with pytest.raises(UnsafePathError, match="lock.mdb .* has 2 hard links"):
        Journal(journal, readonly=readonly)
    done = _cli("verify", journal)
    assert done.returncode in (1, 2) and "hard links" in done.stderr and "Traceback" not in done.stderr
    assert victim.read_bytes() == b"x" * 32  # untouched (LMDB would have grown it to 16 512 bytes)


@pytest.mark.parametrize("readonly", [True, False])
def test_a_hard_linked_data_file_is_refused(journal, tmp_path, readonly):
    os.link(_data(journal), tmp_path / "other-name")
    with pytest.raises(UnsafePathError, match="data.mdb .* has 2 hard links"):
        Journal(journal, readonly=readonly)


@pytest.mark.parametrize("name", ["data.mdb", "lock.mdb"])
@pytest.mark.parametrize("readonly", [True, False])
def test_a_symbolic_link_as_an_lmdb_file_is_refused(journal, tmp_path, name, readonly):
    target = tmp_path / "elsewhere"
    shutil.move(os.path.join(journal, name), target)
    os.symlink(target, os.path.join(journal, name))
    with pytest.raises(UnsafePathError, match=f"{name} .* symbolic link"):
        Journal(journal, readonly=readonly)


@pytest.mark.parametrize("name", ["data.mdb", "lock.mdb"])
@pytest.mark.parametrize("readonly", [True, False])
def test_a_fifo_as_an_lmdb_file_is_refused_without_hanging(journal, name, readonly):
    os.unlink(os.path.join(journal, name))
    os.mkfifo(os.path.join(journal, name))
    with pytest.raises(UnsafePathError, match=f"{name} .* is a FIFO, not a regular file"):
        Journal(journal, readonly=readonly)


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
@pytest.mark.parametrize("name", ["data.mdb", "lock.mdb"])
@pytest.mark.parametrize("readonly", [True, False])
def test_an_lmdb_file_owned_by_another_user_is_refused(journal, name, readonly):
    os.chown(os.path.join(journal, name), 4321, 4321)
    with pytest.raises(UnsafePathError, match=f"{name} .* belongs to user id 4321"):
        Journal(journal, readonly=readonly)
