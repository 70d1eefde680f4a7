"""Bundles: `export --bundle` writes a selection of a journal to one file, `import` brings it back as a
journal that replays exactly, `verify` checks the file without importing it; a damaged or crafted
bundle is refused with what is wrong, and nothing of it is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

from stepjournal import Journal, journaled
from stepjournal.errors import IntegrityError, JournalError, RemoteFormatError
from stepjournal.sharing import export_bundle, import_bundle, verify_bundle
from stepjournal.upkeep import Retention, prune
from stepjournal.sharing._remote import journal_id  # private: the remote layout
from stepjournal.adapters.cli import main as cli

BIN = os.path.dirname(sys.executable)


def record(path, *, run="exp"):
    """Steps 1-4 of `run`: generate (with its input) and a reward stage; returns the outputs by step."""
    gen = torch.Generator().manual_seed(len(run))
    outputs = {}

    def generate(prompts):
        return {"responses": torch.randn(4, 8, generator=gen, dtype=torch.float64), "uid": ["a", "b", "c", "d"]}

    def reward(batch):
        return batch["responses"].sum(dim=1)

    with Journal(str(path), run=run) as journal:
        rollout = journaled(generate, journal, "cache")
        score = journaled(reward, journal, "cache", stage="reward")
        for step in range(1, 5):
            outputs[step] = rollout(prompts=f"prompt {step}", step=step)
            score(outputs[step], step=step)
    return outputs


def entries(path):
    with zipfile.ZipFile(path) as z:
        return {i.filename: z.read(i) for i in z.infolist()}


def rewrite(path, changed):
    """The bundle at `path` again, with `changed` entries (name -> bytes, or None to drop it)."""
    found = entries(path)
    found.update(changed)
    os.unlink(path)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for name, data in found.items():
            if data is not None:
                z.writestr(name, data)


# -- the must-show: a selection exported, imported in a new process, replayed exactly -------------------
REPLAYER = textwrap.dedent("""
    import json, sys
    from stepjournal import Journal, journaled
    folder, out = sys.argv[1:3]

    def generator(prompts):
        raise RuntimeError("the importing machine must not generate")

    with Journal(folder, run="exp") as journal:
        rollout = journaled(generator, journal, "replay")
        got = {step: rollout(prompts=f"prompt {step}", step=step) for step in (2, 3)}
    json.dump({s: {"hex": o["responses"].numpy().tobytes().hex(), "dtype": str(o["responses"].dtype),
                   "uid": o["uid"]} for s, o in got.items()}, open(out, "w"))
""")


def test_a_selection_typed_in_a_shell_is_imported_on_another_machine_and_replays_bit_identical(tmp_path):
    a, b, bundle = tmp_path / "machine-a" / "journal", tmp_path / "machine-b" / "journal", tmp_path / "exp.bundle"
    recorded = record(a)
    record(a, run="other")
    script = (f"export PATH={BIN}:$PATH; set -e; "
              f"stepjournal export {a} --bundle {bundle} --run exp --steps 2-3 --stage generate; "
              f"stepjournal verify {bundle}; stepjournal import {bundle} {b}")
    shell = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300)
    assert shell.returncode == 0, shell.stderr
    assert "bundled 3 events and 4 payloads from 1 journal into" in shell.stdout  # a session, steps 2 and 3
    assert "bundle is whole: 3 events decode" in shell.stdout
    assert "imported 3 events, 4 payloads" in shell.stdout
    out = tmp_path / "replayed.json"
    child = subprocess.run([sys.executable, "-c", REPLAYER, str(b), str(out)], capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr
    replayed = json.loads(out.read_text())
    for step in (2, 3):
        assert replayed[str(step)] == {"hex": recorded[step]["responses"].numpy().tobytes().hex(),
                                       "dtype": "torch.float64", "uid": ["a", "b", "c", "d"]}
    with Journal(str(a), readonly=True) as ja, Journal(str(b), readonly=True, run="exp") as jb:
        source = journal_id(ja)
        seqs = {(r.step, r.stage): r.seq for r in ja.audit() if r.run == "exp"}
        imported = [r for r in jb.audit() if r.action == "generated"]
        assert {(r.run, r.stage) for r in jb.audit()} == {("exp", "generate")} and jb.verify() == []
    # only what was selected came, and every imported call names where it was recorded
    assert [(r.step, r.stage, r.origin_journal, r.origin_seq) for r in imported] == [
        (step, "generate", source, seqs[(step, "generate")]) for step in (2, 3)]


def test_export_progress_ends_full(tmp_path):
    """A bar drawn from the reports ends at its total (it stopped at the last multiple of 1024)."""
    record(tmp_path / "j")
    seen = []
    export_bundle(str(tmp_path / "j"), str(tmp_path / "b.sjb"), progress=lambda *report: seen.append(report))
    with Journal(str(tmp_path / "j"), readonly=True) as journal:
        assert seen and seen[-1] == ("bundle", journal.last_seq(), journal.last_seq())


def test_a_second_import_adds_nothing_and_a_bundle_of_an_import_keeps_the_first_provenance(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    record(a)
    first = export_bundle(str(a), tmp_path / "one.bundle")
    assert first.events == 9 and first.payloads == 16  # a session + 4 steps x 2 stages, each an output and an input
    assert import_bundle(tmp_path / "one.bundle", str(b)).events_pulled == 9
    assert import_bundle(tmp_path / "one.bundle", str(b)).events_pulled == 0
    again = export_bundle(str(b), tmp_path / "two.bundle")  # b holds only imported events
    assert again.sources == first.sources and again.events == 9
    assert entries(tmp_path / "two.bundle") == entries(tmp_path / "one.bundle")  # the same events, the same bytes
    assert import_bundle(tmp_path / "two.bundle", str(c)).events_pulled == 9
    assert import_bundle(tmp_path / "one.bundle", str(c)).events_pulled == 0  # the same journal's events, known
    with Journal(str(a), readonly=True) as ja, Journal(str(c), readonly=True) as jc:
        assert {r.origin_journal for r in jc.audit()} == {journal_id(ja)}
        assert [(r.step, r.stage, r.action) for r in jc.audit()] == [(r.step, r.stage, r.action) for r in ja.audit()]


def test_a_bundle_into_the_journal_it_came_from_adds_nothing(tmp_path):
    record(tmp_path / "a")
    export_bundle(str(tmp_path / "a"), tmp_path / "a.bundle")
    assert import_bundle(tmp_path / "a.bundle", str(tmp_path / "a")).events_pulled == 0


# -- damaged and crafted bundles ---------------------------------------------------------------------
def test_a_damaged_payload_is_found_by_verify_with_its_step_and_refused_by_import(tmp_path, capsys):
    record(tmp_path / "a")
    bundle = tmp_path / "a.bundle"
    export_bundle(str(tmp_path / "a"), bundle, steps={3}, stages={"reward"})
    name, data = next((n, d) for n, d in entries(bundle).items() if n.startswith("payloads/"))
    rewrite(bundle, {name: data[:-1] + bytes([data[-1] ^ 1])})
    events, problems = verify_bundle(bundle)
    assert events == 2 and [(p.kind, p.where, p.steps) for p in problems] == [("payload", name[len("payloads/"):], (3,))]
    assert cli(["verify", str(bundle)]) == 1
    assert "bundle is damaged; affected steps: 3" in capsys.readouterr().out
    with pytest.raises(IntegrityError, match=r"affected steps \[3\]"):
        import_bundle(bundle, str(tmp_path / "b"))
    assert not (tmp_path / "b").exists()  # a failed import into a new folder leaves nothing
    Journal(str(tmp_path / "b")).close()
    with pytest.raises(IntegrityError, match=r"affected steps \[3\]"):
        import_bundle(bundle, str(tmp_path / "b"))
    with Journal(str(tmp_path / "b"), readonly=True) as jb:
        assert jb.audit() == []  # the call that needs the damaged payload did not come in


def test_a_missing_payload_or_a_damaged_segment_is_reported_by_verify(tmp_path):
    record(tmp_path / "a")
    bundle = tmp_path / "a.bundle"
    export_bundle(str(tmp_path / "a"), bundle, steps={1})
    found = entries(bundle)
    payload = next(n for n in found if n.startswith("payloads/"))
    segment = next(n for n in found if n.startswith("segments/"))
    rewrite(bundle, {payload: None})
    assert [p.kind for p in verify_bundle(bundle)[1]] == ["missing_payload"]
    rewrite(bundle, {segment: found[segment][:-3] + b"abc"})
    assert [(p.kind, p.where) for p in verify_bundle(bundle)[1]] == [("segment", segment)]


@pytest.mark.parametrize("crafted, says", [
    ({"../../etc/passwd": b"x"}, "outside the layout"),
    ({"payloads/" + "0" * 64 + "/x": b"x"}, "outside the layout"),
])
def test_an_entry_outside_the_layout_is_refused_before_anything_is_read(tmp_path, crafted, says):
    record(tmp_path / "a")
    bundle = tmp_path / "a.bundle"
    export_bundle(str(tmp_path / "a"), bundle)
    rewrite(bundle, crafted)
    for action in (lambda: verify_bundle(bundle), lambda: import_bundle(bundle, str(tmp_path / "b"))):
        with pytest.raises(IntegrityError, match=says):
            action()
    assert not (tmp_path / "b").exists()


def test_a_compressed_entry_is_refused_so_no_bomb_can_hide_in_a_bundle(tmp_path):
    record(tmp_path / "a")
    bundle = tmp_path / "a.bundle"
    export_bundle(str(tmp_path / "a"), bundle)
    found = entries(bundle)
    os.unlink(bundle)
    with zipfile.ZipFile(bundle, "w") as z:
        for name, data in found.items():
            z.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED if name.startswith("payloads/") else None)
    with pytest.raises(IntegrityError, match="compressed or encrypted"):
        verify_bundle(bundle)


def test_a_file_that_is_not_a_bundle_and_a_bundle_of_a_newer_format_are_clear_errors(tmp_path, capsys):
    os.mkfifo(tmp_path / "fifo.bundle")  # never opened for reading in a way that could hang
    with pytest.raises(IntegrityError, match="not a regular file"):
        verify_bundle(tmp_path / "fifo.bundle")
    (tmp_path / "notes.txt").write_text("not a bundle")
    with pytest.raises(IntegrityError, match="not a stepjournal bundle"):
        verify_bundle(tmp_path / "notes.txt")
    assert cli(["import", str(tmp_path / "notes.txt"), str(tmp_path / "b")]) == 1
    assert "not a stepjournal bundle" in capsys.readouterr().err
    record(tmp_path / "a")
    bundle = tmp_path / "a.bundle"
    export_bundle(str(tmp_path / "a"), bundle)
    rewrite(bundle, {"stepjournal-remote.json": json.dumps({"kind": "stepjournal-remote", "format": 99}).encode()})
    for action in (lambda: verify_bundle(bundle), lambda: import_bundle(bundle, str(tmp_path / "b"))):
        with pytest.raises(RemoteFormatError, match="upgrade stepjournal"):
            action()


# -- what export refuses ---------------------------------------------------------------------------
def test_export_never_overwrites_and_a_selection_of_nothing_leaves_no_file(tmp_path, capsys):
    record(tmp_path / "a")
    (tmp_path / "taken.bundle").write_bytes(b"mine")
    with pytest.raises(JournalError, match="exists"):
        export_bundle(str(tmp_path / "a"), tmp_path / "taken.bundle")
    assert (tmp_path / "taken.bundle").read_bytes() == b"mine"
    with pytest.raises(JournalError, match="nothing in .* matches the selection"):
        export_bundle(str(tmp_path / "a"), tmp_path / "none.bundle", runs={"no-such-run"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "taken.bundle"]
    assert cli(["export", str(tmp_path / "a"), "--to", str(tmp_path / "x"), "--stage", "reward"]) == 2
    assert "--stage goes with --bundle" in capsys.readouterr().err
    assert cli(["export", str(tmp_path / "a"), "--bundle", str(tmp_path / "new.bundle"), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["schema_version"] == 1 and printed["events"] == 9 and printed["path"] == str(tmp_path / "new.bundle")


def test_a_journal_pruned_by_retention_bundles_its_events_and_the_import_serves_only_what_was_kept(tmp_path):
    recorded = record(tmp_path / "a")
    with Journal(str(tmp_path / "a"), session=False) as journal:
        prune(journal, Retention(keep_last=2))  # steps 1 and 2 of each stage lose their payloads
    report = export_bundle(str(tmp_path / "a"), tmp_path / "all.bundle")
    assert report.payloads == 8 and verify_bundle(tmp_path / "all.bundle")[1] == []
    import_bundle(tmp_path / "all.bundle", str(tmp_path / "b"))
    with Journal(str(tmp_path / "a"), readonly=True) as ja, Journal(str(tmp_path / "b"), readonly=True, run="exp") as jb:
        assert [(r.step, r.stage, r.action) for r in jb.audit()] == [(r.step, r.stage, r.action) for r in ja.audit()]
        assert jb.recorded_steps() == [3, 4] and jb.verify() == []
        assert torch.equal(jb.load_output(jb.lookup(4))["responses"], recorded[4]["responses"])
    # a payload that is absent without a release is damage, as before
    name = next(n for n in entries(tmp_path / "all.bundle") if n.startswith("payloads/"))
    rewrite(tmp_path / "all.bundle", {name: None})
    assert [p.kind for p in verify_bundle(tmp_path / "all.bundle")[1]] == ["missing_payload"]


def test_prune_of_a_run_reads_an_imported_journal_whose_log_holds_an_import_event(tmp_path, capsys):
    """An import writes an `EventsImported`, which names no run: `prune --run` reads the runs of the sessions."""
    a, b = tmp_path / "a", tmp_path / "b"
    record(a)
    export_bundle(str(a), tmp_path / "one.bundle")
    import_bundle(tmp_path / "one.bundle", str(b))
    with Journal(str(b), readonly=True) as journal:
        (run,) = {opened.run for _, opened in journal.sessions()}
    assert cli(["prune", str(b), "--run", run, "--keep-last", "1", "--dry-run"]) == 0
    assert cli(["prune", str(b), "--run", "nosuch", "--keep-last", "1", "--dry-run"]) == 1
    assert "no run 'nosuch' in" in capsys.readouterr().err
