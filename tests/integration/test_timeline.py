"""`stepjournal timeline`: merged segments, stable session numbers, named hidden sources, bounded pictures."""

from __future__ import annotations

import argparse
import io
import os

import attrs
import matplotlib.image
import numpy as np
import pytest
import torch
from matplotlib.collections import PolyCollection
from matplotlib.patches import FancyArrowPatch
from rich.console import Console

from stepjournal import Journal, journaled
from stepjournal.index import AuditRecord
from stepjournal.adapters.cli import _timeline  # private: a CLI helper under test
from stepjournal.adapters.cli._timeline import (  # private: a CLI helper under test
    COLOURS, MAX_ARROWS, build_timeline, render_image,
)
from stepjournal.policies import ReplayMissError, StepRanges

from cli_support import ok
from cli_support import run_cli as cli
from doc_lines import command_lines, run_line, shown_under

DOC_LINES = [line for line in command_lines("docs/audit.md") if line.text.startswith("stepjournal timeline journal ")]


def rollout(prompts: torch.Tensor, step: int) -> dict:
    return {"ids": prompts + step}


def refuse(prompts: torch.Tensor, step: int) -> dict:
    raise AssertionError("must be replayed")


def make_journal(path: str, steps: int = 12) -> None:
    """Session 1 dumps 1-5 and repeats to `steps`, with a bypassed validation call every 4 steps;
    session 2 replays steps 1-3 exactly and is refused at step `steps + 5`; session 3 caches steps 9-10."""
    prompts = torch.arange(4)
    with Journal(path, run="exp") as j:
        train = journaled(rollout, j, "dump@1-5;repeat")
        validate = journaled(rollout, j, "dump@1-5;repeat", mode_of=lambda *a, **k: "validate")
        for step in range(1, steps + 1):
            train(prompts, step=step)
            if step % 4 == 0:
                validate(prompts, step=step)
    with Journal(path, run="exp") as j:
        replay = journaled(refuse, j, "replay")
        for step in (1, 2, 3):
            replay(prompts, step=step)
        with pytest.raises(ReplayMissError):
            replay(prompts, step=steps + 5)
    with Journal(path, run="exp") as j:
        cache = journaled(rollout, j, "cache")
        for step in (9, 10):
            cache(prompts, step=step)


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("timeline") / "journal")
    make_journal(path)
    return path


@pytest.fixture(scope="module")
def records(journal) -> list:
    with Journal(journal, readonly=True) as j:
        return j.audit()


def long_run(steps: int) -> list[AuditRecord]:
    """The audit of a ``dump@1-5;repeat`` run of `steps` steps with a validation call every 100 steps,
    written as records (journaling 30 000 steps would take the test a minute)."""
    records, seq = [], 1
    for step in range(1, steps + 1):
        seq += 1
        if step <= 5:
            records.append(AuditRecord(seq=seq, session="a", run="exp", step=step, gen_index=0, mode="train",
                                       action="generated", stored=True, policy="dump@1-5", reason="dump", ts=0.0))
        else:
            source = (step - 6) % 5 + 1
            records.append(AuditRecord(seq=seq, session="a", run="exp", step=step, gen_index=0, mode="train",
                                       action="replayed", stored=False, policy="repeat", reason="repeat", ts=0.0,
                                       source_run="exp", source_step=source, source_gen_index=0,
                                       source_seq=source + 1))
        if step % 100 == 0:
            seq += 1
            records.append(AuditRecord(seq=seq, session="a", run="exp", step=step, gen_index=0, mode="validate",
                                       action="bypassed", stored=False, policy="bypass", reason="bypass", ts=0.0))
    return records


def colour_pixels(image: np.ndarray, hex_colour: str) -> int:
    rgb = np.array([int(hex_colour[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(image[..., :3] - rgb).max(axis=-1) < 0.02).sum())


# -- outputs ---------------------------------------------------------------------------------------------
def test_png_shows_each_kind_of_call_in_its_colour(journal, tmp_path):
    out = tmp_path / "timeline.png"
    ok(cli("timeline", journal, "--out", str(out)))
    image = matplotlib.image.imread(str(out))
    height, width = image.shape[:2]
    assert 500 <= width <= 1600 and 200 <= height <= 1200
    kinds = ("generated", "replayed (same step)", "replayed (other step)", "bypassed", "refused")
    counts = {kind: colour_pixels(image, COLOURS[kind]) for kind in kinds}
    assert all(n > 200 for n in counts.values()), counts


def test_html_is_one_self_contained_file_with_merged_bars_and_linked_replays(journal, records, tmp_path):
    out = tmp_path / "timeline.html"
    ok(cli("timeline", journal, "--out", str(out)))
    page = out.read_text()
    replays = sum(r.action == "replayed" for r in records)
    assert page.count('<g class="link"') == replays  # few replays: one arrow each, back to its source
    # s1 train: one bar for dump@1-5, one for repeat; s2: one exact-replay bar and one refusal
    assert page.count('data-kind="replayed (other step)"') == 1 and page.count('data-kind="refused"') == 1
    assert "steps 6-12 #0 (train, run exp): 7 replayed (other step) from step 1 ... 2" in page
    assert ">dump@1-5</text>" in page and ">repeat</text>" in page  # the clause bands are labelled
    assert "<script" not in page and "src=" not in page and "href=" not in page


def test_svg_is_drawn(journal, tmp_path):
    out = tmp_path / "timeline.svg"
    ok(cli("timeline", journal, "--out", str(out)))
    assert out.read_text().lstrip().startswith("<?xml") and "<svg" in out.read_text()


def test_a_small_journal_draws_without_progress_on_stderr(journal, tmp_path):
    result = ok(cli("timeline", journal, "--out", str(tmp_path / "t.png")))
    assert result.stderr == "" and result.stdout.startswith("wrote ")


def test_a_large_journal_shows_progress_on_stderr(journal, tmp_path, monkeypatch):
    monkeypatch.setattr(_timeline, "PROGRESS_ABOVE", 0)  # this journal counts as large
    out, err = io.StringIO(), io.StringIO()
    args = argparse.Namespace(journal=journal, out=str(tmp_path / "t.html"), run=None, steps=None, mode=None)
    assert _timeline.run(args, Console(file=out, width=200), Console(file=err, width=100, force_terminal=True)) == 0
    assert "drawn" in err.getvalue() and "wrote" in out.getvalue() and "drawn" not in out.getvalue()


# -- layout ----------------------------------------------------------------------------------------------
def test_consecutive_calls_with_one_kind_and_clause_are_one_segment(records):
    timeline = build_timeline(records, title="t")
    s1_train = [s for s in timeline.segments if timeline.lanes[s.lane] == "s1 train #0"]
    assert [(s.kind, s.policy, s.count) for s in s1_train] == [
        ("generated", "dump@1-5", 5), ("replayed (other step)", "repeat", 7)]
    bands = [(b.policy, b.end - b.start + 1) for b in timeline.bands if timeline.lanes[b.lane] == "s1 validate #0"]
    assert bands == [("bypass", 9)]  # one band over the validation lane's gaps (steps 4, 8, 12)


def test_sessions_keep_their_numbers_under_a_step_filter(journal, records, tmp_path):
    whole = build_timeline(records, title="t")
    part = build_timeline(records, title="t", steps=StepRanges.parse("9-10"))
    assert set(part.lanes) <= set(whole.lanes) and "s3 train #0" in part.lanes and "s1 train #0" in part.lanes
    ok(cli("timeline", journal, "--steps", "9-10", "--out", str(tmp_path / "t.html")))
    assert "s3 train #0" in (tmp_path / "t.html").read_text()


def test_sessions_are_named_in_the_order_they_opened_as_runs_and_audit_name_them(records):
    """Two sessions of a multi-node run can open in one order and make their first calls in the other:
    the timeline names them by opening, as `session_names` (runs, audit, diff) does."""
    from stepjournal.index import session_names

    called = list(dict.fromkeys(r.session for r in records))
    opened = called[::-1]  # the session that called first opened last
    timeline = build_timeline(records, title="t", sessions=opened)
    names = session_names(opened)
    assert names[called[0]] == f"s{len(called)}" and f"s{len(called)} train #0" in timeline.lanes
    assert names[called[-1]] == "s1" and any(lane.startswith("s1 ") for lane in timeline.lanes)
    assert build_timeline(records, title="t").lanes != timeline.lanes  # by first call, the names differ


def test_sources_a_filter_hides_are_named_in_the_text_output(journal, tmp_path):
    """docs/audit.md's ``stepjournal timeline journal --steps 7-10 --out part.png``, typed in the folder
    of this module's journal (named ``journal``), prints what the page shows under it."""
    (line,) = DOC_LINES
    result = run_line(line.text, os.path.dirname(journal))
    assert result.returncode == 0, result.stderr
    assert shown_under(line) == result.stdout.rstrip("\n").splitlines()
    assert "4 replays served from s1 run exp steps 2-5" in (
        ok(cli("timeline", journal, "--steps", "7-10", "--out", str(tmp_path / "t.html"))).stdout)


def test_a_replay_of_the_same_step_and_of_another_step_differ_in_kind(records):
    kinds = {(r.step, r.policy): c.colour_key for c in build_timeline(records, title="t").cells for r in [c.record]}
    assert kinds[(2, "replay")] == "replayed (same step)" and kinds[(7, "repeat")] == "replayed (other step)"


# -- long runs -------------------------------------------------------------------------------------------
def test_thirty_thousand_steps_draw_a_bounded_figure_from_a_few_collections(tmp_path):
    timeline = build_timeline(long_run(30_000), title="long")
    out = tmp_path / "long.png"
    fig = render_image(timeline, str(out))
    height, width = matplotlib.image.imread(str(out)).shape[:2]
    assert width <= 1600 and height <= 1200
    lanes = fig.axes[0]
    bars = [c for c in lanes.collections if isinstance(c, PolyCollection)]
    assert len(bars) == 2  # the bands and the bars, each one collection
    assert sum(len(c.get_paths()) for c in bars) == len(timeline.segments) + len(timeline.bands)
    assert len(timeline.segments) == 2 + 300  # dump, repeat, and each validation call on its own
    assert not [p for p in lanes.patches if isinstance(p, FancyArrowPatch)]  # 29 995 links: no arrows


def test_arrows_are_drawn_only_when_few(records, tmp_path):
    few = build_timeline(records, title="t")
    fig = render_image(few, str(tmp_path / "few.png"))
    arrows = [p for p in fig.axes[0].patches if isinstance(p, FancyArrowPatch)]
    assert len(arrows) == len(few.links) <= MAX_ARROWS
    many = build_timeline(long_run(MAX_ARROWS + 10), title="t")
    assert len(many.links) > MAX_ARROWS and not many.arrows


def test_the_source_panel_plots_a_sawtooth_for_repeat(tmp_path):
    fig = render_image(build_timeline(long_run(20), title="t"), str(tmp_path / "p.png"))
    panel = fig.axes[1]
    ys = sorted((x, y) for c in panel.collections for x, y in c.get_offsets())
    assert [int(y) for _, y in ys] == [1, 2, 3, 4, 5] * 4  # generated 1-5, then 1-5 again and again


def test_the_verb_reads_the_calls_the_audit_gives_with_released_records_marked(journal, tmp_path):
    from stepjournal.upkeep import Retention, prune
    from stepjournal.adapters.cli._render import clean  # private: a CLI helper under test
    from stepjournal.adapters.cli._timeline_layout import record_of  # private: a CLI helper under test

    path = str(tmp_path / "pruned")
    with Journal(path, run="exp\x1b[31m") as j:
        for step in range(1, 6):
            j.record(step, {"ids": torch.full((3,), step)}, policy="dump\u202e", reason="r\x07")
        prune(j, Retention(keep_last=2))
    for source in (journal, path):
        with Journal(source, readonly=True) as j:
            rows = _timeline.read_rows(j)
            records = [r for r in j.audit() if r.action != "released"]
        safe = [attrs.evolve(r, run=clean(r.run), mode=clean(r.mode), policy=clean(r.policy), reason=clean(r.reason),
                             source_run=None if r.source_run is None else clean(r.source_run)) for r in records]
        assert [record_of(row) for row in rows] == safe
    assert [r.released_by is not None for r in records] == [True, True, True, False, False]
    a, b = build_timeline(safe, title="t"), _timeline.build_timeline_rows(rows, title="t")
    assert (a.steps, a.lanes, a.cells, a.segments, a.bands, a.links) == (b.steps, b.lanes, b.cells, b.segments,
                                                                         b.bands, b.links)
    assert {c.colour_key for c in b.cells} == {"generated (released)", "generated"}
