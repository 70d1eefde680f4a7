"""The payload-store suite shipped in `stepjournal.testing`: the store docs/journal.md writes ("Writing a payload
store", from nothing but the docs) passes it, and a store that declares a capability it does not have fails it,
in the test of that capability."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import PayloadStoreError
from stepjournal.testing import PayloadStoreConformance, payload_of, run_conformance
from test_docs import ROOT, python_blocks

SUITE_SIZE = len([name for name in dir(PayloadStoreConformance) if name.startswith("test_")])


@pytest.fixture
def docs(tmp_path, monkeypatch) -> dict:
    """The names docs/journal.md's store example defines, its block run as the docs test runs it."""
    monkeypatch.chdir(tmp_path)
    [block] = [code for _, code in python_blocks(ROOT / "docs" / "journal.md") if "class DictPayloadStore(" in code]
    namespace: dict = {"__name__": "docs_journal"}
    exec(compile(block, "journal.md[Writing a payload store]", "exec"), namespace)  # the docs are ours
    return namespace


def test_the_store_written_from_the_docs_passes_every_test_of_the_shipped_suite(docs):
    assert SUITE_SIZE >= 22
    assert run_conformance(docs["DictPayloadStoreSuite"]()) == SUITE_SIZE


def _lies(docs: dict) -> dict:
    """Stores that declare what they cannot do, by the suite test each one must fail."""
    base = docs["DictPayloadStore"]
    elsewhere = base()
    elsewhere.put(*payload_of("a payload the store itself does not hold"))
    return {
        # put keeps `bytes(blob)`: a list of pieces is no bytes-like value
        "test_a_store_that_takes_pieces_stores_them_joined": type("Pieces", (base,), {"takes_pieces": True}),
        # the default `stage` stages nothing
        "test_a_store_that_stages_writes_stores_a_staged_payload_once_put_and_none_discarded":
            type("Stages", (base,), {"stages_writes": True}),
        "test_check_many_agrees_with_check_on_whole_damaged_and_missing_payloads":
            type("AllWhole", (base,), {"check_many": lambda self, items: [None] * len(items)}),
        "test_lmdb_bytes_counts_no_more_than_the_payloads_stored":
            type("Counts", (base,), {"lmdb_bytes": lambda self, items: 1 << 40}),
        "test_the_payload_files_a_store_keeps_are_among_its_payloads": type("Files", (base,), {"files": elsewhere}),
    }


@pytest.mark.parametrize("failing", [
    "test_a_store_that_takes_pieces_stores_them_joined",
    "test_a_store_that_stages_writes_stores_a_staged_payload_once_put_and_none_discarded",
    "test_check_many_agrees_with_check_on_whole_damaged_and_missing_payloads",
    "test_lmdb_bytes_counts_no_more_than_the_payloads_stored",
    "test_the_payload_files_a_store_keeps_are_among_its_payloads",
])
def test_a_store_declaring_a_capability_it_does_not_have_fails_that_capabilitys_test(docs, failing):
    liar = _lies(docs)[failing]

    class Suite(docs["DictPayloadStoreSuite"]):
        def make_store(self, tmp_path: Path):
            yield liar()

    with pytest.raises(AssertionError) as caught:
        run_conformance(Suite())
    failed = [name for name in dir(PayloadStoreConformance) if name.startswith("test_") and f"\n{name}: " in
              f"\n{caught.value}"]
    assert failed == [failing]
    assert f"1 of {SUITE_SIZE} tests of Suite failed" in str(caught.value)


class _Undeclared:
    """The protocol's nine methods and no capability: what a store written before the declarations looked like."""

    def put(self, digest, blob): ...
    def commit(self, items, write_events): ...
    def get(self, digest, *, nbytes=None): ...
    def view(self, digest, *, nbytes=None): ...
    def check(self, digest, *, nbytes=None): ...
    def has(self, digest): ...
    def __contains__(self, digest): ...
    def digests(self): ...
    def delete(self, digest): ...


def test_a_journal_refuses_a_store_that_leaves_capabilities_undeclared_naming_them(tmp_path):
    with pytest.raises(PayloadStoreError, match=r"does not declare check_many, files, lmdb_bytes, stage, "
                       r"stages_writes, takes_pieces: subclass stepjournal.payloads.PayloadStoreBase"):
        Journal(str(tmp_path / "j"), payload_store=_Undeclared())


def test_the_suite_fails_a_store_that_leaves_capabilities_undeclared_in_its_declaration_test():
    class Suite(PayloadStoreConformance):
        def make_store(self, tmp_path: Path):
            yield _Undeclared()

    with pytest.raises(AssertionError, match=r"does not declare \['check_many'"):
        Suite().test_the_store_declares_every_member_of_the_protocol(Path("unused"))


def test_the_suite_imports_without_pytest(tmp_path):
    """pytest is no dependency of stepjournal: `stepjournal.testing` imports in a process that blocks it."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['pytest'] = None; sys.modules['_pytest'] = None\n"
            "import stepjournal.testing\n"
            "assert stepjournal.payloads.PayloadStoreBase\n")
    done = subprocess.run([sys.executable, "-P", "-c", f"import stepjournal\n{code}"], capture_output=True, text=True,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("takes_pieces", [False, True])
def test_the_journal_hands_a_store_pieces_only_when_it_declares_it_takes_them_and_stages_only_when_declared(
        docs, tmp_path, takes_pieces):
    """The journal reads the declaration: a payload prepared as pieces (``copy=False``) reaches `commit` joined
    unless the store declares `takes_pieces`, and `stage` is never called on a store that does not declare
    `stages_writes`."""
    given = []

    class Watched(docs["DictPayloadStore"]):
        def commit(self, items, write_events):
            given.extend(isinstance(blob, list) for _, blob in items)  # pieces, or one bytes-like value
            return super().commit([(digest, b"".join(blob) if isinstance(blob, list) else blob)
                                   for digest, blob in items], write_events)

        def stage(self, blob):
            raise AssertionError("stage was called on a store that does not declare stages_writes")

    Watched.takes_pieces = takes_pieces
    with Journal(str(tmp_path / "j"), payload_store=Watched()) as journal:
        value = {"ids": torch.arange(1 << 20)}
        rec = journal.record(1, journal.prepare(value, copy=False))
        assert torch.equal(journal.load_output(rec)["ids"], value["ids"])
    assert given == [takes_pieces]
