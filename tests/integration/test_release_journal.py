"""The journal written by stepjournal 0.1.0 (tests/data/journal-0.1.0, made by make_release_journal.py).

Every later release must open it, verify it, read its events and replay it unchanged. The folder in
the repository is never opened for writing: each test copies it first.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch

from stepjournal import Journal
from stepjournal.events import CallBypassed, CallRefused, GenerationRecorded, ReplayServed, SessionOpened
from stepjournal.adapters import journaled
from cli_support import run_cli

DATA = Path(__file__).parent.parent / "data"
sys.path.insert(0, str(DATA))
from make_release_journal import rollout  # noqa: E402


@pytest.fixture
def release(tmp_path) -> str:
    target = tmp_path / "journal-0.1.0"
    target.mkdir(mode=0o700)
    shutil.copy2(DATA / "journal-0.1.0" / "data.mdb", target / "data.mdb")
    return str(target)


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def test_the_release_journal_opens_read_only_verifies_and_holds_its_events(release):
    with Journal(release, readonly=True) as journal:
        assert journal.verify() == []
        kinds = [type(e).__name__ for _, e in journal.events()]
        assert kinds.count(SessionOpened.__name__) == 3
        assert kinds.count(GenerationRecorded.__name__) == 6
        assert kinds.count(ReplayServed.__name__) == 3
        assert kinds.count(CallBypassed.__name__) == 1 and kinds.count(CallRefused.__name__) == 1
    with Journal(release, run="exp", readonly=True) as journal:
        assert journal.recorded_steps() == [1, 2, 3, 4]
        assert journal.recorded_indices(3) == [0, 1]
        for step, k in [(1, 0), (2, 0), (3, 0), (3, 1), (4, 0)]:
            assert _same(journal.load_output(journal.lookup(step, gen_index=k)), rollout(step, k))
    with Journal(release, run="other", readonly=True) as journal:
        record = journal.lookup(1)
        assert record.event.output.compression == "zstd"
        assert _same(journal.load_output(record), rollout(1, 5))
        assert journal.load_input(record) == {"prompt": "2+2"}


def test_the_release_journal_replays_unchanged_without_running_the_generator(release):
    def must_not_run(step):
        raise AssertionError(f"the generator ran at step {step}")

    with Journal(release, run="exp", fingerprint={"model": "tiny", "n": 4, "seed": 7}) as journal:
        gen = journaled(must_not_run, journal, "replay")
        for step in range(1, 5):
            assert _same(gen(step=step), rollout(step, 0))
            assert gen.last_outcome.action == "replayed"
        assert _same(gen(step=3), rollout(3, 1))  # the second call of step 3
        assert journal.verify() == []


def test_the_cli_audits_and_verifies_the_release_journal(release):
    audit = run_cli("audit", release, "--json")
    assert audit.returncode == 0, audit.stderr
    assert audit.stdout.count('"replayed"') >= 3 and '"refused"' in audit.stdout
    verify = run_cli("verify", release)
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_release_journal_replays_and_takes_new_large_records_as_payload_files(release):
    """A journal from before payload files: its records replay from LMDB, a new large one is a file."""
    import os

    from stepjournal.payloads._file_store import PAYLOAD_FOLDER  # private: the file store's layout

    assert not os.path.exists(os.path.join(release, PAYLOAD_FOLDER))
    from stepjournal.payloads._payload_store import FILE_FROM  # private: the store's internals

    large = {"ids": torch.arange(FILE_FROM // 8 + 1)}
    with Journal(release, run="exp") as journal:
        assert _same(journal.load_output(journal.lookup(2)), rollout(2, 0))
        digest = journal.record(9, large).event.output.digest
    assert os.path.isfile(os.path.join(release, PAYLOAD_FOLDER, digest[:2], digest[2:]))
    with Journal(release, run="exp", readonly=True) as journal:
        assert journal.verify() == []
        assert torch.equal(journal.load_output(journal.lookup(9))["ids"], large["ids"])
        assert _same(journal.load_output(journal.lookup(1)), rollout(1, 0))
