"""Payload files and the verbs that race: placing a file and releasing it exclude each other, in any process.

A payload file is content-addressed: a record can name bytes a release in another process is letting go
of. Each race here is made at an observed point: the first process stops there (`kill_points.Lockstep`,
its filesystem steps and LMDB commits), the second runs its whole verb, then the first goes on. Nothing
acknowledged may be lost, and `verify` must find the journal whole.
"""

from __future__ import annotations

import os
import shutil
from typing import Callable, List, Optional, Tuple

import pytest

from cli_support import run_cli
from journal_workers import REFUSED, SMALL_FILE_FROM, VERBS, content, run_verb, verb_in_lockstep
from kill_points import start_process
from lmdb_raw import flip_byte
from reliability_support import worker_context
from stepjournal import Journal
from stepjournal.errors import CompactError, JournalError
from stepjournal.sharing import export_bundle, list_remotes, push
from stepjournal.upkeep import Retention, compact, prune
from stepjournal.events._events import (  # private: event classes and maps, below the face
    EventsImported, GenerationRecorded,
)
from stepjournal.events._keys import seq_key  # private: the key layout itself
from stepjournal.storage._appender import appender_of  # private: the journal's own payload files and store (the internal seam)


def _small_files(patch: pytest.MonkeyPatch) -> None:
    """Payloads of `SMALL_FILE_FROM` bytes and more are files in this process's journals, until `patch` is undone."""
    import stepjournal.payloads._payload_store as payload_store  # private: the store's internals

    patch.setattr(payload_store, "FILE_FROM", SMALL_FILE_FROM)


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A journal whose "base" run holds three payload files (X, Y, Z), a remote and a bundle to bring in:
    what each race starts from (copied)."""
    root = tmp_path_factory.mktemp("races")
    with pytest.MonkeyPatch.context() as patch:
        _small_files(patch)
        seed = str(root / "seed")
        with Journal(seed, run="base") as journal:
            for step, name in enumerate("XYZ"):
                journal.record(step, content(name))
        # Pulled in two runs (segments of four events): Y's record, T's and the release of Y's, then X's and U's.
        source = str(root / "source")
        with Journal(source, run="src") as journal:
            journal.record(0, content("Y"))
            journal.record(1, content("T"))
            prune(journal, Retention(keep_last=1))
            journal.record(2, content("X"))
            journal.record(3, content("U"))
        remote = str(root / "remote")
        push(source, remote, segment_events=4)
        other = str(root / "other")
        with Journal(other, run="bund") as journal:
            journal.record(0, content("X"))
            journal.record(1, content("Q"))
        bundle = str(root / "bundle.zip")
        export_bundle(other, bundle)
    return {"seed": seed, "remote": remote, "bundle": bundle}


def _race(place: dict, tmp: str, first: str, second: str, at: Callable[[str], bool]) -> Tuple[List[str], int]:
    """Run `first` in lockstep on a copy of the seed journal and `second`, whole, in another process at each
    point `at` accepts (`at` sees every point; `second` never runs where `first` holds what it would wait
    for); check the journal after. Returns the points `first` reached and the number of races run."""
    os.makedirs(tmp, exist_ok=True)
    path = os.path.join(tmp, "journal")
    shutil.copytree(place["seed"], path)
    ack = os.path.join(tmp, "acks")
    ctx = worker_context()
    child = start_process(ctx, verb_in_lockstep, first, path, place, 0, ack)
    tag = 0
    while True:
        label = child.next_point()
        if label is None:
            break
        if at(label) and not label.endswith(" held"):
            tag += 1
            proc = ctx.Process(target=run_verb, args=(second, path, place, tag, ack))
            proc.start()
            proc.join(120)
            assert proc.exitcode in (0, REFUSED), f"{second} at {label!r} of {first} exited {proc.exitcode}"
        child.go()
    child.finish(exits=(0, REFUSED))
    _check_whole(path, ack, f"{second} in {first}", place.get("payload_store"))
    return child.seen, tag


def _check_whole(path: str, ack: str, what: str, objects: Optional[str] = None) -> None:
    """Every acknowledged record and remote is there, and `verify` (of the object store at `objects`, when
    the journal's payloads are there) finds nothing wrong."""
    with open(ack, encoding="utf-8") as f:
        acked = f.read().split("\n")
    with Journal(path, readonly=True, payload_store=objects) as journal:
        assert journal.verify() == [], what
        recorded = {(e.run, e.step) for _, e in journal.events(types=[GenerationRecorded])}
        imported = {e.origin for _, e in journal.events(types=[EventsImported])}
    remotes = {r.name for r in list_remotes(path)}
    for line in filter(None, acked):
        kind, *rest = line.split(" ")
        if kind == "record":
            assert (rest[0], int(rest[1])) in recorded, (what, line)
        elif kind == "remote":
            assert rest[0] in remotes, (what, line)
        elif kind in ("pull", "import"):
            assert imported, (what, line)


def _first(label_start: str) -> Callable[[str], bool]:
    """A stop at the first point whose label starts with `label_start`."""
    seen = [False]

    def at(label: str) -> bool:
        if seen[0] or not label.startswith(label_start):
            return False
        seen[0] = True
        return True

    return at


def _committed_after(write: str) -> Callable[[str], bool]:
    """A stop at the end of the first write transaction that made a write `write` (``lmdb delete``)."""
    state = [False, False]  # seen the write, stopped

    def at(label: str) -> bool:
        state[0] = state[0] or label.startswith(write)
        if state[0] and not state[1] and label == "lmdb committed":
            state[1] = True
            return True
        return False

    return at


def _after(first: str) -> Callable[[str], bool]:
    """A stop at the point right after the first one whose label starts with `first`."""
    state: List[Optional[bool]] = [None]

    def at(label: str) -> bool:
        if state[0] is None:
            state[0] = label.startswith(first) or None
            return False
        if state[0]:
            state[0] = False
            return True
        return False

    return at


# -- placing and releasing exclude each other -------------------------------------------------------
def test_a_record_whose_file_a_prune_in_another_process_deleted_meanwhile_places_it_again(place, tmp_path):
    """The record's file is in place (renamed from tmp/), its event not yet committed; a prune releases
    the older record of the same bytes and deletes the file; the record then commits."""
    seen, races = _race(place, str(tmp_path), "record", "prune", _after("os.rename payloads/tmp/"))
    assert races == 1 and any(label.startswith("os.rename payloads/tmp/") for label in seen)


def test_a_prune_keeps_a_file_that_a_record_of_another_process_named_after_its_release(place, tmp_path):
    """The prune's release has committed, its file not yet deleted; a record of the same bytes commits."""
    _seen, races = _race(place, str(tmp_path), "prune", "record", _committed_after("lmdb delete"))
    assert races == 1


def test_retention_keeps_a_file_that_a_record_of_another_process_named_after_its_release(place, tmp_path):
    """`Journal(retention=...)` released X in its record's transaction; a record of X commits before the
    file is deleted."""
    _seen, races = _race(place, str(tmp_path), "retention", "record", _committed_after("lmdb delete"))
    assert races == 1


def test_a_pull_refuses_a_run_whose_payloads_a_prune_in_another_process_released_after_it_was_planned(
        place, tmp_path):
    """The pull's second run names X, which the journal held when the run was planned (so not fetched);
    after the first run commits, a prune releases the journal's record of X and deletes its file."""
    seen, races = _race(place, str(tmp_path), "pull", "prune", _first("pull "))
    assert races == 1
    with open(tmp_path / "acks", encoding="utf-8") as f:
        assert "refused IntegrityError" in f.read().split("\n")


def _object_store_place(tmp: str) -> dict:
    """A journal whose "base" run keeps X, Y and Z in an object store (``file://``), the cache its own."""
    with pytest.MonkeyPatch.context() as patch:
        _small_files(patch)
        objects = "file://" + os.path.join(tmp, "objects")
        os.makedirs(os.path.join(tmp, "objects"))
        seed = os.path.join(tmp, "seed")
        with Journal(seed, run="base", payload_store=objects) as journal:
            for step, name in enumerate("XYZ"):
                journal.record(step, content(name))
    return {"seed": seed, "payload_store": objects}


@pytest.mark.parametrize("first, release", [("prune", 2), ("retention", 3)])
def test_an_object_store_release_keeps_an_object_a_record_of_another_process_named_after_it(tmp_path, first, release):
    """With ``payload_store=``, the release has committed (the `release`-th write transaction), its objects
    not yet deleted; a record of the same bytes (found in the cache, so not sent again) commits."""
    place = _object_store_place(str(tmp_path / "place"))
    _seen, races = _race(place, str(tmp_path / "race"), first, "record", _occurrence("lmdb committed", release))
    assert races == 1


def _remote_without(place: dict, tmp_path, name: str) -> str:
    """A copy of the seed remote whose object of `content(name)` is gone: a pull of it fails at its second run."""
    remote = str(tmp_path / "remote")
    shutil.copytree(place["remote"], remote)
    with pytest.MonkeyPatch.context() as patch:
        _small_files(patch)
        with Journal(str(tmp_path / "scratch"), session=False) as journal:
            os.unlink(os.path.join(remote, "payloads", journal.prepare(content(name)).key.hex()))
    return remote


def _go_to(child, stop: Callable[[str], bool]) -> None:
    """Let `child` go on to the first point `stop` accepts, where it waits."""
    label = child.next_point()
    while label is not None and not stop(label):
        child.go()
        label = child.next_point()
    assert label is not None, child.seen


def test_a_pull_that_fails_into_a_journal_it_created_keeps_a_record_another_process_committed_there(
        place, tmp_path):
    """A pull into a new folder commits its first run; a record of another process commits into the journal it
    made; the pull's second run then fails (an object of it is gone from the remote). The acknowledged record
    stays: the pull removes only a journal that holds nothing but what it brought."""
    remote = _remote_without(place, tmp_path, "U")
    path, ack = str(tmp_path / "new"), str(tmp_path / "acks")
    ctx = worker_context()
    child = start_process(ctx, verb_in_lockstep, "pull", path, dict(place, remote=remote), 0, ack)
    _go_to(child, lambda label: label.startswith("pull "))  # its first run committed
    proc = ctx.Process(target=run_verb, args=("record", path, place, 1, ack))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    child.go()
    child.finish(exits=(REFUSED,))
    _check_whole(path, ack, "record in a failing pull")


def test_a_pull_that_fails_into_a_journal_it_created_keeps_it_while_another_process_has_it_open(place, tmp_path):
    """As above, the other process having opened the journal and committed nothing yet when the pull fails:
    its record, acknowledged after, would be written into a removed file."""
    remote = _remote_without(place, tmp_path, "U")
    path, ack = str(tmp_path / "new"), str(tmp_path / "acks")
    ctx = worker_context()
    child = start_process(ctx, verb_in_lockstep, "pull", path, dict(place, remote=remote), 0, ack)
    _go_to(child, lambda label: label.startswith("pull "))
    writer = start_process(ctx, verb_in_lockstep, "record", path, place, 1, ack)
    _go_to(writer, lambda label: label.startswith("lmdb put"))  # open, in its first write transaction
    child.go()
    child.finish(exits=(REFUSED,))
    writer.go()
    writer.finish()
    _check_whole(path, ack, "record in a failing pull")


# -- a fork child, the size cap -------------------------------------------------------------------
def _fork_child_drops(held: list) -> None:
    held.clear()  # the child's copy of the prepared payload goes away unrecorded


def test_a_fork_child_leaves_its_parents_staged_file_alone(tmp_path, monkeypatch):
    import multiprocessing as mp

    _small_files(monkeypatch)
    path = str(tmp_path / "journal")
    with Journal(path) as journal:
        held = [journal.prepare(content("X"), copy=False)]
        files = appender_of(journal).local.files
        _staged_written(journal, held[0])  # before the fork
        child = mp.get_context("fork").Process(target=_fork_child_drops, args=(held,))
        child.start()
        child.join(60)
        assert child.exitcode == 0
        assert files.partial_files(), "the parent's staged file is gone"
        journal.record(0, held[0])
        assert journal.verify() == []


def test_the_size_cap_does_not_count_the_records_own_staged_file(tmp_path, monkeypatch):
    _small_files(monkeypatch)
    path = str(tmp_path / "journal")
    value = content("X")
    with Journal(path) as journal:
        size = journal.prepare(value).ref.stored_nbytes
        used = appender_of(journal).store.used_bytes()
    # Room for the payload once and the event's pages, not for the payload twice.
    with Journal(path, max_size=used + size + (size // 2)) as journal:
        prepared = journal.prepare(value, copy=False)  # as `record` does: its file staged in tmp/
        _staged_written(journal, prepared)
        journal.record(0, prepared)
        assert journal.verify() == []


@pytest.mark.parametrize("size", [-1, 1.5, True, 1 << 64])
@pytest.mark.parametrize("name", ["max_size", "map_size"])
def test_a_size_that_is_not_one_is_refused_in_one_line(tmp_path, name, size):
    with pytest.raises(JournalError, match=f"{name}={size!r} is not a size"):
        Journal(str(tmp_path / "journal"), **{name: size})


def _staged_written(journal: Journal, prepared) -> None:
    """Wait until the file staged for `prepared` is written whole (its thread is done)."""
    for staged in appender_of(journal).local.files._staged[prepared.key]:
        staged._thread.join()


# -- compact --to ------------------------------------------------------------------------------------
def test_compact_to_refuses_a_journal_with_an_event_it_cannot_read(tmp_path, monkeypatch):
    _small_files(monkeypatch)
    path = str(tmp_path / "journal")
    with Journal(path) as journal:
        journal.record(0, content("X"))
        journal.record(1, "small")
    flip_byte(path, "events", seq_key(3), offset=-3)  # step 1's event: its CRC no longer holds
    with pytest.raises(CompactError, match="event #3"):
        compact(path, to=str(tmp_path / "copy"))
    assert not os.path.exists(tmp_path / "copy")
    result = run_cli("compact", path, "--to", str(tmp_path / "copy2"))
    assert result.returncode != 0 and "event #3" in result.stderr and "Traceback" not in result.stderr
    assert not os.path.exists(tmp_path / "copy2")


def _recorded_as_files(path: str, names: str) -> List[Tuple[bytes, str]]:
    """A journal at `path` (closed) with one payload file a step for each of `names`, steps from 1; its
    files' (digest, path)."""
    with Journal(path) as journal:
        for step, name in enumerate(names, start=1):
            journal.record(step, content(name))
        files = appender_of(journal).local.files
        return [(digest, files.path_of(digest)) for digest in sorted(files.digests())]


def _whole_copy_holds(path: str, files: int) -> None:
    with Journal(path, readonly=True) as journal:
        assert journal.verify() == []
        assert len(list(appender_of(journal).local.files.digests())) == files


def test_compact_to_copies_every_payload_file_the_events_name(tmp_path, monkeypatch):
    _small_files(monkeypatch)
    path = str(tmp_path / "journal")
    _recorded_as_files(path, "XY")
    compact(path, to=str(tmp_path / "copy"))
    _whole_copy_holds(str(tmp_path / "copy"), 2)


def test_compact_to_refuses_a_journal_missing_a_payload_file_a_record_uses(tmp_path, monkeypatch):
    _small_files(monkeypatch)
    path = str(tmp_path / "journal")
    lost, lost_path = _recorded_as_files(path, "XY")[0]
    os.unlink(lost_path)  # the source is damaged: a copy of it must not pass for whole
    result = run_cli("compact", path, "--to", str(tmp_path / "copy"))
    assert result.returncode != 0 and "1 payload(s)" in result.stderr and lost.hex()[:16] in result.stderr
    assert "Traceback" not in result.stderr and not os.path.exists(tmp_path / "copy")


def test_compact_to_copies_a_journal_whose_released_payloads_are_gone(tmp_path, monkeypatch):
    _small_files(monkeypatch)
    path = str(tmp_path / "journal")
    _recorded_as_files(path, "XYZ")
    with Journal(path) as journal:
        prune(journal, Retention(keep_last=1))
    compact(path, to=str(tmp_path / "copy"))
    _whole_copy_holds(str(tmp_path / "copy"), 1)


# -- the concurrency matrix ----------------------------------------------------------------------------
def _occurrence(label: str, n: int) -> Callable[[str], bool]:
    """A stop at the `n`-th point labelled `label` (counted from 1): the same point in each run, whatever
    order a staging thread's points and the caller's come in."""
    count = [0]

    def at(seen: str) -> bool:
        count[0] += seen == label
        return seen == label and count[0] == n

    return at


@pytest.mark.parametrize("first", VERBS)
def test_every_writing_verb_against_every_other_at_each_observed_point(place, tmp_path, first):
    """`first` stops at one observed point where it holds nothing the others wait for; another verb runs
    whole there in another process; `first` goes on. Each pair at each such point, on a journal of its own:
    nothing acknowledged is lost, and `verify` finds the journal whole."""
    seen, _ = _race(place, str(tmp_path / "alone"), first, first, lambda label: False)
    free = [(label, seen[:at].count(label)) for at, label in enumerate(seen, 1) if not label.endswith(" held")]
    assert len(free) >= 2, seen
    for second in VERBS:
        for at, (label, n) in enumerate(free):
            where = str(tmp_path / f"{second.replace(' ', '-')}-{at}")
            _seen, races = _race(place, where, first, second, _occurrence(label, n))
            assert races == 1, (second, label, n)
            shutil.rmtree(where)  # whole: hundreds of journals would fill a small disk (a failing one stays)
