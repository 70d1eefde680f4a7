"""push / pull / clone against a real S3 server (moto on 127.0.0.1): two journal folders stand for
two machines; what comes back is bit-identical, carries its provenance, and nothing is sent twice."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from s3_server import s3_env, s3_server, subprocess_env  # noqa: F401  (fixtures)
from stepjournal import Journal, journaled
from stepjournal.errors import IntegrityError, JournalError, RemoteConflictError, RemoteError, RemoteFormatError
from stepjournal.events import GenerationRecorded, ReplayServed
from stepjournal.payloads import ObjectPayloadStore
from stepjournal.sharing import clone, pull, push
from stepjournal.upkeep import Retention, compact, prune
from stepjournal.sharing import (  # private: the sharing internals under test
    _pull as pull_module, _remote as remote_module,
)
from stepjournal.events._events import EventsImported  # private: event classes and maps, below the face
from stepjournal.payloads._object_client import Remote  # private: the object client under test
from stepjournal.sharing._remote import Released, journal_id  # private: the remote layout
from stepjournal.events._events import call_refs  # private: event classes and maps, below the face
from stepjournal.adapters.cli import main as cli


def record_steps(path, steps, *, run="exp", scale=1, compression=None):
    with Journal(str(path), run=run, compression=compression) as journal:
        for step in steps:
            journal.record(step, {"ids": torch.arange(256) * step * scale, "text": f"step {step}"},
                           input={"prompt": torch.full((4,), step)})


def own_events(path):
    """(seq, stored bytes) of the events a journal recorded itself (not pulled)."""
    with Journal(str(path), readonly=True) as journal:
        return [(seq, bytes(raw)) for seq, raw in journal.raw_events()]


def pulled(path):
    """{(source, source seq): stored bytes} of every pulled event of a journal."""
    out = {}
    with Journal(str(path), readonly=True) as journal:
        raws = dict(journal.raw_events())
        for seq, event in journal.events(types=[EventsImported]):
            for offset in range(event.source_last - event.source_first + 1):
                out[(event.source, event.source_first + offset)] = bytes(raws[seq + 1 + offset])
    return out


def test_a_clone_holds_every_event_bit_identical_and_every_payload(tmp_path, s3_env):
    a, b = tmp_path / "a", tmp_path / "b"
    record_steps(a, range(1, 6), compression="zstd")
    report = push(str(a), s3_env + "/team")
    assert report.events_sent == len(own_events(a)) and report.payloads_sent == 10
    cloned = clone(s3_env + "/team", str(b))
    with Journal(str(a), readonly=True) as ja:
        source = journal_id(ja)
    assert cloned.events_pulled == report.events_sent and cloned.sources == (source,)
    assert pulled(b) == {(source, seq): raw for seq, raw in own_events(a)}
    with Journal(str(a), readonly=True, run="exp") as ja, Journal(str(b), readonly=True, run="exp") as jb:
        assert jb.recorded_steps() == [1, 2, 3, 4, 5] and jb.verify() == []
        for step in range(1, 6):
            assert jb.payload_bytes(jb.lookup(step).event.output.digest) == ja.payload_bytes(
                ja.lookup(step).event.output.digest)


def test_a_payload_of_megabytes_comes_through_a_clone_bit_for_bit(tmp_path, s3_env):
    values = torch.randn(3 << 18, generator=torch.Generator().manual_seed(5))  # 3 MiB: read into a mapping of its own
    with Journal(str(tmp_path / "a"), run="exp") as journal:
        journal.record(1, {"values": values})
    push(str(tmp_path / "a"), s3_env)
    assert clone(s3_env, str(tmp_path / "b")).bytes_fetched > 3 << 20
    with Journal(str(tmp_path / "b"), readonly=True, run="exp") as journal:
        assert torch.equal(journal.load_output(journal.lookup(1))["values"], values)


def test_a_second_push_sends_nothing_and_a_second_pull_fetches_nothing(tmp_path, s3_env):
    a, b = tmp_path / "a", tmp_path / "b"
    record_steps(a, [1, 2])
    push(str(a), s3_env)
    again = push(str(a), s3_env)
    assert (again.events_sent, again.segments_sent, again.payloads_sent, again.bytes_sent) == (0, 0, 0, 0)
    clone(s3_env, str(b))
    before = own_events(b)
    assert pull(s3_env, str(b)).events_pulled == 0 and own_events(b) == before


def test_push_and_pull_are_incremental(tmp_path, s3_env):
    a, b = tmp_path / "a", tmp_path / "b"
    record_steps(a, [1, 2])
    push(str(a), s3_env)
    clone(s3_env, str(b))
    record_steps(a, [3])  # a new session and one more record
    more = push(str(a), s3_env)
    assert more.events_sent == 2 and more.payloads_sent == 2
    assert pull(s3_env, str(b)).events_pulled == 2
    with Journal(str(b), readonly=True, run="exp") as jb:
        assert jb.recorded_steps() == [1, 2, 3]


def test_a_push_killed_before_its_head_was_written_resumes_without_duplicates_or_gaps(tmp_path, s3_env):
    """The state a kill leaves between the segment upload and the head update: objects no head names."""
    a, b = tmp_path / "a", tmp_path / "b"
    record_steps(a, [1, 2])
    push(str(a), s3_env)
    remote = Remote(s3_env)
    with Journal(str(a), readonly=True) as ja:
        head_key = f"heads/{journal_id(ja)}.json"
    old_head = remote.get(head_key, limit=1 << 20)
    record_steps(a, [3, 4])
    push(str(a), s3_env)
    remote.put(head_key, old_head)  # as if killed just before the head was written
    resumed = push(str(a), s3_env)
    assert resumed.events_sent == 3 and resumed.payloads_sent == 0  # payloads were there already
    clone(s3_env, str(b))
    with Journal(str(a), readonly=True) as ja:
        source = journal_id(ja)
    got = pulled(b)
    assert sorted(seq for _, seq in got) == [seq for seq, _ in own_events(a)]
    assert got == {(source, seq): raw for seq, raw in own_events(a)}


def test_two_journals_pushed_to_one_remote_merge_and_the_audit_shows_where_each_call_came_from(tmp_path, s3_env):
    one, two, b = tmp_path / "one", tmp_path / "two", tmp_path / "b"
    record_steps(one, [1, 2], run="alice")
    record_steps(two, [1, 2, 3], run="bob", scale=10)
    push(str(one), s3_env)
    push(str(two), s3_env)
    assert len(clone(s3_env, str(b)).sources) == 2
    ids = {}
    for path in (one, two):
        with Journal(str(path), readonly=True) as j:
            ids[path.name] = (journal_id(j), {r.step: r.seq for r in j.audit()})
    with Journal(str(b), readonly=True) as jb:
        records = jb.audit()
        assert sorted((r.run, r.step) for r in records) == [("alice", 1), ("alice", 2), ("bob", 1), ("bob", 2), ("bob", 3)]
        for r in records:
            source, seqs = ids["one" if r.run == "alice" else "two"]
            assert (r.origin_journal, r.origin_seq) == (source, seqs[r.step])
            assert r.to_json()["origin_journal"] == source
        assert jb.recorded_steps(run="bob") == [1, 2, 3]


def _looked_up(monkeypatch) -> list:
    """The keys each `Remote.exists` (a HEAD) is asked for, in this process."""
    asked, real = [], Remote.exists
    monkeypatch.setattr(Remote, "exists", lambda self, key: asked.append(key) or real(self, key))
    return asked


def test_a_push_of_many_payloads_lists_a_remote_that_holds_few_once_instead_of_a_head_of_each(tmp_path, s3_env,
                                                                                            monkeypatch):
    remote = f"{s3_env}/shared"
    record_steps(tmp_path / "a", [1, 2])
    record_steps(tmp_path / "b", [1, 2, 3, 4, 5])  # steps 1 and 2 hold a's payloads; 3-5, six of its own
    assert push(str(tmp_path / "a"), remote).payloads_sent == 4
    asked = _looked_up(monkeypatch)
    report = push(str(tmp_path / "b"), remote)
    assert report.payloads_sent == 6 and asked == []  # a's four found in the listing, not sent again; no HEAD
    assert clone(remote, str(tmp_path / "c")).payloads_fetched == 10


def test_a_push_looks_up_each_payload_on_a_remote_that_holds_many_or_cannot_be_listed(tmp_path, monkeypatch):
    import stepjournal.sharing._remote as remote_module  # private: the remote layout

    remote = (tmp_path / "remote").as_uri()
    record_steps(tmp_path / "a", [1, 2])
    record_steps(tmp_path / "b", [1, 2, 3, 4, 5])
    assert push(str(tmp_path / "a"), remote).payloads_sent == 4
    # More payloads there than a push lists: a HEAD of each it would send (a push costs what it sends).
    monkeypatch.setattr(remote_module, "_LISTED_AT_MOST", 3)
    asked = _looked_up(monkeypatch)
    assert push(str(tmp_path / "b"), remote).payloads_sent == 6 and len(asked) == 10
    # An object under payloads/ that no listing can read (a name that is not UTF-8): the listing fails, the push
    # looks each payload up, and says so at info.
    from log_capture import captured_events

    monkeypatch.setattr(remote_module, "_LISTED_AT_MOST", 1000)
    record_steps(tmp_path / "d", [1, 2, 3, 4, 6])  # step 6's two payloads are new
    (tmp_path / "remote" / "payloads" / "\udcff").touch()
    with pytest.raises(RemoteError, match="listing"):
        Remote(remote).keys("payloads/")
    asked.clear()
    with captured_events() as events:
        assert push(str(tmp_path / "d"), remote).payloads_sent == 2
    assert len(asked) == 10 and [e["event"] for e in events].count("push_looks_up_payloads_one_by_one") == 1
    assert clone(remote, str(tmp_path / "c")).payloads_fetched == 12


def test_a_remote_listing_more_journals_than_a_pull_reads_is_refused_before_any_head_is_read(
        tmp_path, s3_env, monkeypatch):
    for name in ("one", "two", "three"):
        record_steps(tmp_path / name, [1], run=name)
        push(str(tmp_path / name), s3_env)
    monkeypatch.setattr(pull_module, "_MAX_SOURCES", 2)
    read, reader = [], Remote._read
    monkeypatch.setattr(Remote, "_read", lambda self, key, limit: read.append(key) or reader(self, key, limit))
    with pytest.raises(RemoteError, match=r"heads/ lists more than 2 objects"):
        clone(s3_env, str(tmp_path / "b"))
    assert read == ["stepjournal-remote.json"]  # the manifest, and no head


def test_a_journal_does_not_pull_back_its_own_events_nor_push_what_it_pulled(tmp_path, s3_env):
    a, b = tmp_path / "a", tmp_path / "b"
    record_steps(a, [1])
    push(str(a), s3_env)
    clone(s3_env, str(b))
    record_steps(b, [2], run="b-run")
    sent = push(str(b), s3_env)
    assert sent.events_sent == 2  # b's own session and record, not what it pulled from a
    assert pull(s3_env, str(b)).events_pulled == 0
    assert pull(s3_env, str(a)).events_pulled == 2
    with Journal(str(a), readonly=True) as ja:
        assert ja.recorded_steps(run="b-run") == [2]


def test_a_damaged_remote_payload_is_reported_with_its_steps_and_nothing_of_it_is_pulled(tmp_path, s3_env):
    a, b = tmp_path / "a", tmp_path / "b"
    record_steps(a, [1, 2, 3])
    push(str(a), s3_env)
    with Journal(str(a), readonly=True, run="exp") as ja:
        digest = ja.lookup(2).event.output.digest
    store = ObjectPayloadStore(s3_env)
    data = bytearray(store.remote.get("payloads/" + digest, limit=1 << 20))
    data[-1] ^= 0xFF
    store.remote.put("payloads/" + digest, bytes(data))
    with pytest.raises(IntegrityError, match=r"affected steps \[2\]") as caught:
        clone(s3_env, str(b))
    assert caught.value.step == 2 and not b.exists()  # a failed clone leaves nothing (tests/integration/test_failed_verbs.py)
    Journal(str(b)).close()
    with pytest.raises(IntegrityError, match=r"affected steps \[2\]"):
        pull(s3_env, str(b))  # into an existing journal: what the damage touches is not pulled
    with Journal(str(b), readonly=True, run="exp") as jb:
        assert jb.recorded_steps() == [] and digest not in {d.hex() for d in jb.payload_store.digests()}


def test_a_missing_remote_payload_is_reported_with_its_steps(tmp_path, s3_env):
    a, b = tmp_path / "a", tmp_path / "b"
    record_steps(a, [1, 2])
    push(str(a), s3_env)
    with Journal(str(a), readonly=True, run="exp") as ja:
        digest = ja.lookup(1).event.output.digest
    Remote(s3_env).delete("payloads/" + digest)
    with pytest.raises(IntegrityError, match=r"PayloadMissingError.*affected steps \[1\]"):
        clone(s3_env, str(b))


def test_a_damaged_or_missing_segment_is_refused(tmp_path, s3_env):
    a = tmp_path / "a"
    record_steps(a, [1])
    push(str(a), s3_env)
    remote = Remote(s3_env)
    (segment,) = remote.keys("segments/")
    body = bytearray(remote.get(segment, limit=1 << 20))
    body[-1] ^= 0x01
    remote.put(segment, bytes(body))
    with pytest.raises(IntegrityError, match="does not match its digest"):
        clone(s3_env, str(tmp_path / "b"))
    remote.delete(segment)
    with pytest.raises(RemoteError, match="missing"):
        clone(s3_env, str(tmp_path / "c"))


def test_a_remote_of_a_newer_format_is_a_clear_error(tmp_path, s3_env, capsys):
    record_steps(tmp_path / "a", [1])
    Remote(s3_env).put("stepjournal-remote.json", json.dumps({"kind": "stepjournal-remote", "format": 2}).encode())
    with pytest.raises(RemoteFormatError, match="format 2.*upgrade stepjournal"):
        push(str(tmp_path / "a"), s3_env)
    with pytest.raises(RemoteFormatError):
        pull(s3_env, str(tmp_path / "b"))
    assert cli(["clone", s3_env, str(tmp_path / "c")]) == 1
    assert "format 2" in capsys.readouterr().err


def test_pulling_from_a_url_that_holds_no_remote_says_so(tmp_path, s3_env):
    with pytest.raises(RemoteError, match="no stepjournal remote"):
        pull(s3_env + "/empty", str(tmp_path / "b"))


def test_a_journal_that_diverged_from_what_it_pushed_is_refused(tmp_path, s3_env):
    import shutil

    a = tmp_path / "a"
    record_steps(a, [1])
    shutil.copytree(a, tmp_path / "copy")
    record_steps(a, [2])
    push(str(a), s3_env)
    record_steps(tmp_path / "copy", [3])  # same id, another history
    with pytest.raises(RemoteError, match="diverged"):
        push(str(tmp_path / "copy"), s3_env)


def racing_push(a, url, raced):
    """A progress callback that, after the first head write, lets another push of `a` run to the end."""
    def progress(_what, _done, _total):
        if not raced:
            raced.append(None)
            raced[0] = push(str(a), url)
    return progress


def test_a_push_racing_another_push_of_the_same_journal_is_refused_and_nothing_is_lost(tmp_path, s3_env):
    a, b, url = tmp_path / "a", tmp_path / "b", s3_env + "/race"
    record_steps(a, range(1, 7))
    raced = []
    with pytest.raises(RemoteConflictError, match="another push ran meanwhile; run this push again"):
        push(str(a), url, progress=racing_push(a, url, raced), segment_events=2)
    assert raced[0].last_seq == 7  # the other push went on from the first one's head, to the end
    assert push(str(a), url).events_sent == 0
    clone(url, str(b))
    with Journal(str(a), readonly=True) as ja:
        source = journal_id(ja)
    assert pulled(b) == {(source, seq): raw for seq, raw in own_events(a)}  # once each, no gap


def test_on_a_local_folder_remote_a_second_push_of_the_same_journal_is_refused_while_one_runs(tmp_path):
    a, b, url = tmp_path / "a", tmp_path / "b", (tmp_path / "remote").as_uri()
    record_steps(a, range(1, 7))
    raced = []
    with pytest.raises(RemoteConflictError, match="another push holds"):
        push(str(a), url, progress=racing_push(a, url, raced), segment_events=2)
    assert push(str(a), url).last_seq == 7  # once the first is gone, a push goes on where it stopped
    clone(url, str(b))
    assert sorted(seq for _, seq in pulled(b)) == list(range(1, 8))


def test_the_events_of_one_stage_in_a_clone_leave_out_its_import_marker(tmp_path):
    """An `EventsImported` belongs to no stage: a stage filter over every run skips it, as it skips a session."""
    a, b, url = tmp_path / "a", tmp_path / "b", (tmp_path / "remote").as_uri()
    record_steps(a, range(1, 4))
    push(str(a), url)
    clone(url, str(b))
    with Journal(str(b), readonly=True) as journal:
        assert any(isinstance(event, EventsImported) for _, event in journal.events())
        assert [event.step for _, event in journal.events(stage="generate")] == [1, 2, 3]


def test_a_journal_pruned_by_retention_pushes_its_events_and_a_clone_serves_only_what_was_kept(tmp_path, s3_env):
    a, b = tmp_path / "a", tmp_path / "b"
    record_steps(a, range(1, 6))
    with Journal(str(a), session=False) as journal:
        prune(journal, Retention(keep_last=2))  # steps 1-3 lose their payloads; their events stay
    report = push(str(a), s3_env + "/pruned")
    assert report.events_sent == len(own_events(a)) and report.payloads_sent == 4  # steps 4, 5: output + input
    clone(s3_env + "/pruned", str(b))
    with Journal(str(a), readonly=True, run="exp") as ja, Journal(str(b), readonly=True, run="exp") as jb:
        assert jb.recorded_steps() == [4, 5] and jb.verify() == []
        assert [(r.step, r.action) for r in jb.audit()] == [(r.step, r.action) for r in ja.audit()]
        assert jb.load_output(jb.lookup(5))["text"] == "step 5"
    # The pulled releases name their records by A's seqs: reindex and retention on B read them as B's.
    with Journal(str(b), session=False, run="exp") as jb:
        jb.reindex()
        assert jb.recorded_steps() == [4, 5] and jb.verify() == []
        plan = prune(jb, Retention(keep_last=1))
        assert [r.step for r in plan.releases] == [4]  # not 1-3 again: retention knows A released them
    with Journal(str(b), readonly=True, run="exp") as jb:
        assert jb.recorded_steps() == [5] and jb.verify() == []
    Remote(s3_env + "/pruned").delete(next(k for k in Remote(s3_env + "/pruned").keys("payloads/")))
    with pytest.raises(IntegrityError, match="missing or damaged"):  # absent without a release: damage
        clone(s3_env + "/pruned", str(tmp_path / "c"))


def test_a_push_reads_the_log_for_releases_only_once_a_payload_is_missing_and_answers_as_the_scan(
        tmp_path, s3_env, monkeypatch):
    scans = []
    scan = remote_module.released_digests
    monkeypatch.setattr(remote_module, "released_digests", lambda journal: scans.append(journal.path) or scan(journal))
    a, b = tmp_path / "a", tmp_path / "b"
    record_steps(a, range(1, 6))
    push(str(a), s3_env + "/whole")
    assert scans == []  # nothing is missing: the log is not read for releases
    with Journal(str(a), session=False) as journal:
        prune(journal, Retention(keep_last=2))  # steps 1-3 lose their payloads
    compact(str(a))
    record_steps(a, [6])
    report = push(str(a), s3_env + "/pruned")
    assert len(scans) == 1 and report.payloads_sent == 6  # one read, whatever the number missing; steps 4-6 sent
    clone(s3_env + "/pruned", str(b))
    for path in (a, b):  # pruned and compacted; pulled
        with Journal(str(path), readonly=True) as journal:
            named = {ref.digest for _seq, event in journal.events() for ref in call_refs(event)}
            released = Released(journal)
            assert scan(journal) and {d for d in named | {"0" * 64} if d in released} == scan(journal)


def test_push_and_clone_in_a_fresh_process_never_import_torch(tmp_path):
    record_steps(tmp_path / "a", [1, 2])
    remote = (tmp_path / "remote").as_uri()
    script = textwrap.dedent(f"""
        import sys
        from stepjournal.sharing import clone, push
        from stepjournal.adapters.cli import main
        assert main(["push", {str(tmp_path / "a")!r}, {remote!r}]) == 0
        print(clone({remote!r}, {str(tmp_path / "b")!r}).payloads_fetched, "torch" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["4", "False"]  # the payloads came, torch (3 s of import) did not


def test_clone_refuses_a_folder_that_holds_something(tmp_path, s3_env):
    record_steps(tmp_path / "a", [1])
    push(str(tmp_path / "a"), s3_env)
    with pytest.raises(JournalError, match="use pull"):
        clone(s3_env, str(tmp_path / "a"))


def test_the_cli_pushes_and_clones_with_progress_on_stderr_and_a_report_on_stdout(tmp_path, s3_env, capsys):
    record_steps(tmp_path / "a", [1, 2])
    assert cli(["push", str(tmp_path / "a"), s3_env, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["events_sent"] == 3 and out["payloads_sent"] == 4
    assert cli(["push", str(tmp_path / "a"), s3_env]) == 0
    assert "nothing sent" in capsys.readouterr().out
    assert cli(["clone", s3_env, str(tmp_path / "b")]) == 0
    assert "cloned 3 events, 4 payloads" in capsys.readouterr().out
    assert cli(["pull", s3_env, str(tmp_path / "b"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["events_pulled"] == 0


# -- the must-show: machine A records and pushes, machine B clones in a new process and replays ------
MACHINE_B = textwrap.dedent("""
    import json, sys
    from stepjournal import Journal, journaled
    from stepjournal.adapters.cli import main
    url, folder, out = sys.argv[1:4]
    assert main(["clone", url, folder]) == 0

    def generator(prompts):
        raise RuntimeError("machine B must not generate")

    with Journal(folder, run="exp1") as journal:
        rollout = journaled(generator, journal, "replay")
        outputs = {step: rollout(prompts=None, step=step) for step in (1, 2, 3)}
    with open(out, "w") as f:
        json.dump({step: {"bytes": o["responses"].numpy().tobytes().hex(), "dtype": str(o["responses"].dtype),
                          "shape": list(o["responses"].shape), "uid": o["uid"]} for step, o in outputs.items()}, f)
    print("--- audit ---", flush=True)
    sys.exit(main(["audit", folder, "--json"]))
""")


def test_machine_b_clones_what_machine_a_pushed_and_replays_it_bit_identical_with_provenance(tmp_path, s3_env, s3_server):
    folder_a, folder_b = tmp_path / "machine-a" / "journal", tmp_path / "machine-b" / "journal"
    gen = torch.Generator().manual_seed(0)

    def generate(prompts):
        return {"responses": torch.randn(4, 16, generator=gen, dtype=torch.float64), "uid": ["a", "b", "c", "d"]}

    with Journal(str(folder_a), run="exp1", compression="zstd") as journal:
        rollout = journaled(generate, journal, "cache")
        recorded = {step: rollout(prompts=None, step=step) for step in (1, 2, 3)}
    assert cli(["push", str(folder_a), s3_env + "/runs/exp1"]) == 0
    out = tmp_path / "b.json"
    child = subprocess.run([sys.executable, "-c", MACHINE_B, s3_env + "/runs/exp1", str(folder_b), str(out)],
                           env=subprocess_env(s3_server), capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr
    replayed = json.loads(out.read_text())
    for step, value in recorded.items():
        got = replayed[str(step)]
        assert got["bytes"] == value["responses"].numpy().tobytes().hex()
        assert (got["dtype"], got["shape"], got["uid"]) == ("torch.float64", [4, 16], ["a", "b", "c", "d"])
    cloned, audit_text = child.stdout.split("--- audit ---\n")
    assert "cloned 4 events" in cloned
    audit = json.loads(audit_text)
    with Journal(str(folder_a), readonly=True) as ja:
        source, seqs = journal_id(ja), {r.step: r.seq for r in ja.audit()}
    generated = [r for r in audit if r["action"] == "generated"]
    replays = [r for r in audit if r["action"] == "replayed"]
    assert [(r["step"], r["origin_journal"], r["origin_seq"]) for r in generated] == [
        (step, source, seqs[step]) for step in (1, 2, 3)]
    assert [r["step"] for r in replays] == [1, 2, 3] and all(r["origin_journal"] is None for r in replays)


def test_an_open_journal_reads_a_replay_pulled_while_it_was_open_by_the_seq_of_its_record_here(tmp_path):
    a, b, url = tmp_path / "a", tmp_path / "b", (tmp_path / "remote").as_uri()
    record_steps(a, [1])
    with Journal(str(a), run="exp") as ja:
        ja.record_replay(2, ja.lookup(1), policy="repeat", reason="repeat: step 2 -> recorded step 1")
    push(str(a), url)
    record_steps(b, [7, 8, 9])  # the pulled events land at other seqs than they had in `a`
    with Journal(str(b), run="exp") as jb:
        before = [jb.as_read_here(seq, e) for seq, e in jb.events()]  # the map of no marker, read once
        assert len(before) > 0
        pull(url, jb)
        (record_seq,) = [seq for seq, e in jb.events(types=[GenerationRecorded]) if e.step == 1]
        ((replay_seq, replay),) = list(jb.events(types=[ReplayServed]))
        assert replay.source_seq != record_seq  # stored as `a` numbered it
        assert jb.as_read_here(replay_seq, replay).source_seq == record_seq
    with Journal(str(b), readonly=True) as fresh:
        assert fresh.as_read_here(replay_seq, replay).source_seq == record_seq
