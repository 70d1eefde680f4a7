"""push, pull and clone tell a progress callback that asks (``counts_total_bytes``) all the bytes they move, so a
bar shows the bytes moved of all and the time left by bytes: each report's total is what the verb then reports
moving, payloads the remote (or the journal) holds already left out."""

from __future__ import annotations

import torch

from stepjournal import Journal
from stepjournal.sharing import clone, pull, push


def recorded(path, steps, scale=1):
    with Journal(str(path), run="exp") as journal:
        for step in steps:
            journal.record(step, {"ids": torch.arange(64) * step * scale})


def reports():
    seen = []

    def progress(what, done, total, moved, moved_total):
        seen.append((what, done, total, moved, moved_total))

    progress.counts_bytes = True
    progress.counts_total_bytes = True
    return seen, progress


def test_push_and_clone_report_all_the_bytes_they_move(tmp_path):
    recorded(tmp_path / "a", range(1, 9))
    seen, progress = reports()
    sent = push(str(tmp_path / "a"), str(tmp_path / "remote"), progress=progress, segment_events=3)
    # a push knows its payloads from the start, each segment as it sends it
    assert len(seen) == 3 and all(moved <= moved_total for *_, moved, moved_total in seen)
    assert seen[0][4] > sent.bytes_sent / 2
    assert seen[-1][3:] == (sent.bytes_sent, sent.bytes_sent)
    seen.clear()
    fetched = clone(str(tmp_path / "remote"), str(tmp_path / "b"), progress=progress)
    assert {total for *_, total in seen} == {fetched.bytes_fetched} and fetched.bytes_fetched > 0  # from the start
    assert seen[-1][3] == fetched.bytes_fetched


def test_payloads_already_there_are_not_counted(tmp_path):
    """b records the same payloads a pushed first: its push sends only its events, and the total says so; a
    pull into a journal holding the payloads counts none."""
    recorded(tmp_path / "a", range(1, 5))
    recorded(tmp_path / "b", range(1, 5))
    push(str(tmp_path / "a"), str(tmp_path / "remote"))
    seen, progress = reports()
    sent = push(str(tmp_path / "b"), str(tmp_path / "remote"), progress=progress)
    assert sent.payloads_sent == 0 and seen[-1][3:] == (sent.bytes_sent, sent.bytes_sent)
    seen.clear()
    fetched = pull(str(tmp_path / "remote"), str(tmp_path / "b"), progress=progress)
    assert fetched.payloads_fetched == 0 and seen[-1][3:] == (0, 0)
