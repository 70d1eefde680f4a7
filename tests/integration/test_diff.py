"""`diff_journals` and `stepjournal diff`: pairing two runs, comparing payloads, reporting where they part."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import msgpack
import numpy as np
import pytest
import torch

from lmdb_raw import flip_byte, items, put_raw
from stepjournal import Journal, diff_journals, journaled
from stepjournal.tools import (
    DIFF_SCHEMA_VERSION,
    DiffReport,
    DiffSide,
    PairDiff,
    Tolerance,
    Tolerances,
    compare_values,
)
from stepjournal.errors import DiffError
from stepjournal.payloads import CodecRegistry
from stepjournal.tools import stage_order
from stepjournal.adapters.cli._diff_plot import render_diff  # private: a CLI helper under test
from stepjournal.events._keys import seq_key  # private: the key layout itself
from cli_support import run_cli


def batch(step: int, *, reward_flip: bool = False, lp_shift: float = 0.0) -> dict:
    reward = torch.tensor([0.0, 1.0, 0.0, 1.0])
    if reward_flip:
        reward[2] = 1.0
    return {
        "responses": torch.arange(4 * 6).reshape(4, 6) + step,
        "old_log_probs": torch.full((4, 6), -0.5) + lp_shift,
        "reward": reward,
        "meta_info": {"temperature": 0.7},
    }


def two_sessions(path: str, changed: dict) -> tuple[str, str]:
    """Session 1 records steps 1-8; session 2 replays 1-6 and generates 7-8 with `changed` outputs."""
    with Journal(path) as journal:
        for step in range(1, 9):
            journal.record(step, batch(step))
        first = journal.session

    def rollout(prompts, step):
        return changed.get(step, batch(step))

    with Journal(path) as journal:
        fn = journaled(rollout, journal, "replay@1-6;dump")
        for step in range(1, 9):
            fn("prompts", step=step)
        second = journal.session
    return first, second


# -- pairing and the summary ------------------------------------------------------------------------
def test_a_replayed_session_agrees_until_the_step_whose_output_changed(jpath):
    first, second = two_sessions(jpath, {7: batch(7, reward_flip=True), 8: batch(8, reward_flip=True)})
    with Journal(jpath, readonly=True) as journal:
        report = diff_journals(journal, journal, session_a=first, session_b=second[:8])
    assert [p.state for p in report.pairs] == ["equal"] * 6 + ["differing"] * 2
    assert report.first_divergence.step == 7
    assert report.summary == (
        "runs agree through step 6; at step 7 the first differing stage is generate "
        "(reward sample 2: 0.0 vs 1.0); 2 of 8 pairs differ"
    )
    assert report.exit_code == 1
    # Only the two differing pairs were loaded (two payloads each); the six replays cost nothing.
    assert report.payloads_loaded == 4


def test_equal_digests_are_equal_without_loading_a_payload(jpath):
    first, second = two_sessions(jpath, {})
    # Damage every stored payload: a diff that loaded one would report it damaged.
    for key, _ in items(jpath, "payloads"):
        flip_byte(jpath, "payloads", key, offset=-1)
    with Journal(jpath, readonly=True) as journal:
        report = diff_journals(journal, journal, session_a=first, session_b=second)
    assert report.counts["equal"] == 8 and report.payloads_loaded == 0
    assert report.exit_code == 0
    assert report.summary == "runs agree: 8 pairs over steps 1-8 are equal"


def test_pairs_present_on_one_side_only_are_reported_as_such(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with Journal(a, run="exp") as journal:
        for step in (1, 2, 3):
            journal.record(step, batch(step))
    with Journal(b, run="exp") as journal:
        for step in (2, 3, 4):
            journal.record(step, batch(step))
        journal.record(3, batch(3), gen_index=1)
    with Journal(a, readonly=True) as ja, Journal(b, readonly=True) as jb:
        report = diff_journals(ja, jb)
    states = {(p.step, p.gen_index): p.state for p in report.pairs}
    assert states == {(1, 0): "only_a", (2, 0): "equal", (3, 0): "equal", (3, 1): "only_b", (4, 0): "only_b"}
    assert report.summary.startswith("runs part at the first compared step; at step 1 the first differing stage is generate (only in A)")


def recorded_then_replayed_later(tmp_path) -> tuple[str, str, str]:
    """A and B record the same steps 1-6; B is then replayed with `repeat_last` (step 6's answer at
    every step). Returns A, B and the replaying session of B."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for path in (a, b):
        with Journal(path, run="exp") as journal:
            for step in range(1, 7):
                journal.record(step, batch(step))

    def rollout(prompts, step):
        raise AssertionError("repeat_last serves every step: nothing generates")

    with Journal(b, run="exp") as journal:
        fn = journaled(rollout, journal, "repeat_last")
        for step in range(1, 7):
            fn("prompts", step=step)
        replayed = journal.session
    return a, b, replayed


def test_by_default_a_run_is_its_recordings_and_a_later_replay_is_left_out(tmp_path):
    a, b, replayed = recorded_then_replayed_later(tmp_path)
    with Journal(a, readonly=True) as ja, Journal(b, readonly=True) as jb:
        report = diff_journals(ja, jb)
        chosen = diff_journals(ja, jb, session_b=replayed[:8])
    assert [p.state for p in report.pairs] == ["equal"] * 6 and report.exit_code == 0
    assert report.a.selects == report.b.selects == "recordings" and report.b.session is None
    # The replaying session, chosen: step 6's answer served at steps 1-5.
    assert chosen.b.selects == "session" and chosen.first_divergence.step == 1
    assert [p.state for p in chosen.pairs] == ["differing"] * 5 + ["equal"]


def test_cli_diff_of_a_run_against_its_later_replayed_copy_says_equal_and_what_it_paired(tmp_path):
    a, b, replayed = recorded_then_replayed_later(tmp_path)
    done = stepjournal_diff(a, b)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()  # each side's line whole, however long its path, to copy
    assert lines[0].startswith("runs agree: 6 pairs over steps 1-6 are equal")
    assert f"A: {a} · run exp · recordings, replays left out" in lines
    assert f"B: {b} · run exp · recordings, replays left out" in lines
    chosen = stepjournal_diff(a, b, "--session-b", replayed[:8])
    assert chosen.returncode == 1 and f"B: {b} · run exp · session s2, replays included" in chosen.stdout.splitlines()


def test_two_runs_of_one_journal_are_chosen_with_run_a_and_run_b(jpath):
    for run, shift in (("base", 0.0), ("new", 0.25)):
        with Journal(jpath, run=run) as journal:
            journal.record(1, batch(1))
            journal.record(2, batch(2, lp_shift=shift))
    with Journal(jpath, readonly=True) as journal:
        with pytest.raises(DiffError, match="several runs .*choose one with run_a") as refused:
            diff_journals(journal, journal)
        # The argument is a typed field: the command line words it as its flag, parsing nothing.
        assert refused.value.argument == "run_a" and refused.value.reason.endswith("holds several runs (base, new)")
        report = diff_journals(journal, journal, run_a="base", run_b="new")
    assert [p.state for p in report.pairs] == ["equal", "differing"]
    diff = report.pairs[1].comparison.first
    assert diff.path == "old_log_probs" and diff.position == (0, 0) and diff.max_abs == pytest.approx(0.25)


def test_cli_errors_name_the_commands_flags_not_python_parameters(jpath):
    for run in ("base", "new"):
        with Journal(jpath, run=run) as journal:
            journal.record(1, batch(1))
    done = stepjournal_diff(jpath, jpath)
    assert done.returncode == 2 and "holds several runs (base, new); choose one with --run-a" in done.stderr
    assert "run_a" not in done.stderr


def test_runs_that_share_no_step_raise_a_clear_error(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    with Journal(a) as journal:
        journal.record(1, batch(1))
        journal.record(2, batch(2))
    with Journal(b) as journal:
        journal.record(10, batch(10))
    with Journal(a, readonly=True) as ja, Journal(b, readonly=True) as jb:
        with pytest.raises(DiffError, match=r"share no step: A \(run 'default'\) has steps 1-2, B \(run 'default'\) has 10"):
            diff_journals(ja, jb)


def test_an_unknown_session_names_the_sessions_there_are(jpath):
    first, _ = two_sessions(jpath, {})
    with Journal(jpath, readonly=True) as journal:
        with pytest.raises(DiffError, match=rf"no session matches 'zzz'; its sessions are: s1 \({first[:8]}\), s2"):
            diff_journals(journal, journal, session_b="zzz")
        by_name = diff_journals(journal, journal, session_a="s1", session_b="s2")
    assert (by_name.a.session, by_name.b.session_name) == (first, "s2")


def test_filters_select_steps_and_mode(jpath):
    with Journal(jpath) as journal:
        for step in (1, 2, 3):
            journal.record(step, batch(step))
            journal.record(step, batch(step), mode="validate")
    with Journal(jpath, readonly=True) as journal:
        report = diff_journals(journal, journal, steps={2, 3}, mode="validate", stage="generate")
        assert [(p.step, p.mode) for p in report.pairs] == [(2, "validate"), (3, "validate")]
        with pytest.raises(DiffError, match="share no step"):
            diff_journals(journal, journal, stage="reward")


def test_the_summary_names_the_first_differing_stage_and_the_equal_ones_before_it(tmp_path):
    """Stages do not exist in the journal yet (issue 15): the report is built from pairs directly."""
    reward_b = torch.zeros(16)
    reward_b[12] = 1.0
    comparison, _ = compare_values(torch.zeros(16), reward_b)
    pairs = tuple(
        PairDiff(stage, "train", step, 0, state, comparison=comparison if state == "differing" else None)
        for step, stage, state in [
            (6, "generate", "equal"), (6, "reward", "equal"),
            (7, "generate", "equal"), (7, "reward", "differing"), (7, "metrics", "differing"),
        ]
    )
    side = DiffSide("j", "default", None, 5, {})
    report = DiffReport(side, side, pairs, Tolerances(), stage_order=("generate", "reward", "metrics"))
    assert report.summary == (
        "runs agree through step 6; at step 7 the first differing stage is reward (sample 12: 0.0 vs 1.0); "
        "generate is equal; 2 of 5 pairs differ"
    )
    page = str(tmp_path / "stages.html")
    render_diff(report, page, title="stages")
    text = open(page, encoding="utf-8").read()
    assert text.index(">generate</th>") < text.index(">reward</th>") < text.index(">metrics</th>")


def test_the_plot_of_10_000_steps_bins_them_into_a_picture_of_readable_size(tmp_path):
    from stepjournal.adapters.cli._diff_plot import MAX_COLUMNS  # private: a CLI helper under test

    reward_b = torch.zeros(16)
    reward_b[12] = 1.0
    comparison, _ = compare_values(torch.zeros(16), reward_b)
    pairs = tuple(
        PairDiff(stage, "train", step, 0, "differing" if (step, stage) == (7777, "reward") else "equal",
                 comparison=comparison if (step, stage) == (7777, "reward") else None)
        for step in range(1, 10_001) for stage in ("generate", "reward")
    )
    side = DiffSide("j", "default", None, 20_000, {})
    report = DiffReport(side, side, pairs, Tolerances())
    png, page = str(tmp_path / "big.png"), str(tmp_path / "big.html")
    render_diff(report, png, title=report.summary)
    render_diff(report, page, title=report.summary)
    with open(png, "rb") as fh:
        header = fh.read(24)
    width, height = int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")
    assert width <= 1600 and height <= 400, (width, height)  # it was 6 000 px wide at 3 000 steps
    text = open(page, encoding="utf-8").read()
    assert text.count("<td") == 2 * MAX_COLUMNS == 400  # 50 steps a column
    assert "<th>7751-7800</th>" in text and text.count('<td class="differing"') == 1
    assert "steps 7751-7800, worst at step 7777 reward: differing; sample 12: 0.0 vs 1.0" in text


def test_stages_sort_in_the_order_the_run_journaled_them_within_a_step():
    """The journal knows no adapter's stage: the events' order in the first step holding a stage places it."""
    calls = [(1, 1, "generate"), (1, 2, "zeta"), (1, 3, "alpha"), (1, 4, "metrics"), (1, 5, "zeta"),
             (2, 6, "generate"), (2, 7, "values"), (2, 8, "zeta"), (0, 0, "generate")]
    # step 0 places generate; step 1 zeta (1), alpha (2), metrics (3); step 2 values (1, with zeta: by name)
    assert stage_order(calls) == ("generate", "values", "zeta", "alpha", "metrics")


def test_a_diff_orders_its_pairs_by_the_stages_the_run_journaled_first(jpath):
    with Journal(jpath, run="r") as journal:
        for step in (1, 2):
            for stage in ("generate", "zeta", "alpha"):
                journal.record(step, {"x": step}, stage=stage, input_digest=None if stage == "generate" else "d")
    with Journal(jpath, readonly=True) as journal:
        report = diff_journals(journal, journal, run_a="r", run_b="r")
    assert report.stage_order == ("generate", "zeta", "alpha")
    assert [p.stage for p in report.pairs][:3] == ["generate", "zeta", "alpha"]
    assert report.to_json()["stage_order"] == ["generate", "zeta", "alpha"]


# -- damage and unreadable payloads -----------------------------------------------------------------
def test_a_damaged_payload_is_reported_damaged_never_differing(jpath):
    first, second = two_sessions(jpath, {7: batch(7, reward_flip=True)})
    with Journal(jpath, readonly=True) as journal:
        digest = journal.lookup(7).event.output.digest  # the output session 2 generated at step 7
    flip_byte(jpath, "payloads", bytes.fromhex(digest), offset=-1)
    with Journal(jpath, readonly=True) as journal:
        report = diff_journals(journal, journal, session_a=first, session_b=second)
    pair = report.pairs[6]
    assert (pair.step, pair.state, pair.comparison) == (7, "damaged", None)
    assert pair.detail.startswith("damaged in B: payload ") and "does not match its digest" in pair.detail
    assert "step 7 the first differing stage is generate (damaged in B" in report.summary
    assert report.exit_code == 1


def test_a_payload_of_an_unregistered_codec_is_unreadable_not_different(tmp_path):
    class Box:
        def __init__(self, value):
            self.value = value

    registry = CodecRegistry()
    registry.register(Box, "test.Box", encode=lambda b: {"value": b.value}, decode=lambda d: Box(d["value"]))
    path = str(tmp_path / "j")
    for run, value in (("a", 1), ("b", 2)):
        with Journal(path, run=run, registry=registry) as journal:
            journal.record(1, Box(torch.tensor([value])))
    with Journal(path, readonly=True) as journal:  # the default registry: no test.Box there
        report = diff_journals(journal, journal, run_a="a", run_b="b")
    assert report.pairs[0].state == "unreadable" and "test.Box" in report.pairs[0].detail
    with Journal(path, readonly=True, registry=registry) as journal:
        report = diff_journals(journal, journal, run_a="a", run_b="b", registry=registry)
    # A registered custom type is compared as its codec stores it.
    assert report.pairs[0].comparison.first.brief() == "value sample 0: 1 vs 2"


def test_events_of_a_newer_schema_are_left_out_and_noted(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for path in (a, b):
        with Journal(path) as journal:
            journal.record(1, batch(1))
            journal.record(2, batch(2))
            last = journal.last_seq()
    newer = {"type": "generation_recorded", "v": 99, "step": 3, "stage": "reward"}
    put_raw(b, "events", seq_key(last + 1), msgpack.packb(newer))
    with Journal(a, readonly=True) as ja, Journal(b, readonly=True) as jb:
        report = diff_journals(ja, jb)
    assert report.exit_code == 0 and len(report.pairs) == 2
    assert report.b.unreadable_events == (last + 1,)
    assert any("newer schema this stepjournal cannot read" in note for note in report.notes)


def test_the_schema_versions_read_are_listed_and_a_self_diff_is_noted(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for path in (a, b):
        with Journal(path) as journal:
            journal.record(1, batch(1))
    with Journal(a, readonly=True) as ja, Journal(b, readonly=True) as jb:
        same = diff_journals(ja, jb)
    assert same.notes == () and same.a.event_versions == {"generation_recorded": (3,), "session_opened": (1,)}
    with Journal(a, readonly=True) as ja:
        itself = diff_journals(ja, ja)
    assert itself.exit_code == 0 and "A and B select the same records" in itself.notes[0]


# -- tolerances --------------------------------------------------------------------------------------
def test_overall_tolerance_turns_a_small_float_difference_into_within_tolerance(jpath):
    first, second = two_sessions(jpath, {7: batch(7, lp_shift=1e-3)})
    with Journal(jpath, readonly=True) as journal:
        strict = diff_journals(journal, journal, session_a=first, session_b=second)
        loose = diff_journals(journal, journal, session_a=first, session_b=second, atol=2e-3)
    assert strict.pairs[6].state == "differing" and loose.pairs[6].state == "within_tolerance"
    assert loose.exit_code == 0 and loose.summary.endswith("are equal, 1 of them within tolerance")


def test_a_per_field_tolerance_applies_to_that_field_only(jpath):
    changed = batch(7, lp_shift=1e-6)
    changed["reward"] = changed["reward"] + 1e-6
    first, second = two_sessions(jpath, {7: changed})
    with Journal(jpath, readonly=True) as journal:
        report = diff_journals(journal, journal, session_a=first, session_b=second, atol=0, rtol=0,
                               tolerances={"old_log_probs": 2e-6})
    comparison = report.pairs[6].comparison
    states = {d.path: d.state for d in comparison.differences}
    assert states == {"old_log_probs": "within_tolerance", "reward": "differing"}
    assert comparison.first.path == "reward"


def test_a_tolerance_for_a_field_neither_side_holds_is_an_error(jpath):
    first, second = two_sessions(jpath, {7: batch(7, lp_shift=1.0)})
    with Journal(jpath, readonly=True) as journal:
        with pytest.raises(DiffError, match="tolerance for 'old_logprobs': no such field on either side"):
            diff_journals(journal, journal, session_a=first, session_b=second, tolerances={"old_logprobs": 1e-6})


def test_per_dtype_defaults_absorb_rounding_but_integers_stay_exact():
    base = torch.linspace(-3, 3, 64)
    ulps = base * (1 + 4e-7)  # a few float32 units in the last place
    assert compare_values(base, ulps)[0].state == "within_tolerance"
    assert compare_values(base, ulps, Tolerances(atol=0.0))[0].state == "differing"
    bf = torch.ones(8, dtype=torch.bfloat16)
    assert compare_values(bf, bf + 0.0078125)[0].state == "within_tolerance"  # one bf16 ulp
    ids = torch.arange(10)
    other = ids.clone()
    other[3] = 4
    loose = Tolerances(atol=10.0, rtol=1.0)
    assert compare_values(ids, other, loose)[0].state == "differing"
    assert compare_values({"ids": ids}, {"ids": other}, Tolerances(fields={"ids": Tolerance(1.0)}))[0].state == "within_tolerance"


def test_nan_equals_nan_only_at_the_same_place():
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert compare_values(a, a.clone())[0].state == "equal"
    moved = torch.tensor([float("nan"), 2.0, 3.0])
    result, _ = compare_values(a, moved, Tolerances(atol=100.0))
    assert result.state == "differing" and result.first.n_outside == 2 and math.isinf(result.first.max_abs)
    assert compare_values(np.array([np.nan, 1.0]), np.array([np.nan, 1.0]))[0].state == "equal"


# -- where values part --------------------------------------------------------------------------------
def test_the_first_differing_position_of_a_2d_tensor_is_sample_row_and_token_offset():
    a = torch.zeros(8, 32)
    b = a.clone()
    b[5, 20] = 1e-9  # within the float32 default
    b[3, 17] = 0.25
    b[6, 2] = -1.0
    diff = compare_values(a, b)[0].first
    assert diff.position == (3, 17) and diff.n_differing == 3 and diff.n_outside == 2
    assert diff.max_abs == 1.0 and diff.max_rel == 1.0
    assert diff.brief() == "sample 3, token 17: 0.0 vs 0.25"


def test_nested_values_report_the_first_differing_path():
    a = {"meta_info": {"temperature": 0.7, "eos": 2}, "responses": ["x"] * 20, "ids": np.arange(4)}
    b = {"meta_info": {"temperature": 1.0, "eos": 2}, "responses": ["x"] * 12 + ["y"] * 8, "ids": np.arange(4)}
    result, _ = compare_values(a, b)
    assert [d.path for d in result.differences[:2]] == ["meta_info.temperature", "responses[12]"]
    assert result.n_differences == 9
    assert result.first.brief() == "meta_info.temperature: 0.7 vs 1.0"
    arrays = compare_values(np.array([{"gt": "1"}, {"gt": "2"}], dtype=object),
                            np.array([{"gt": "1"}, {"gt": "3"}], dtype=object))[0]
    assert arrays.first.brief() == "[1].gt: '2' vs '3'"


def test_strings_report_the_first_differing_sample():
    a = np.array(["the cat", "sat on", "the mat"])
    b = np.array(["the cat", "sat in", "the hat"])
    diff = compare_values(a, b)[0].first
    assert diff.n_differing == 2 and diff.brief() == "sample 1: 'sat on' vs 'sat in'"
    text = compare_values(["abc", "abd"], ["abc", "abe"])[0].first
    assert text.brief() == "[1]: 'abd' vs 'abe'"


def test_shape_dtype_type_and_key_differences_are_named():
    result, _ = compare_values(
        {"a": torch.zeros(2), "b": torch.zeros(2), "c": 1, "d": 1, "only_a": 0},
        {"a": torch.zeros(3), "b": torch.zeros(2, dtype=torch.float64), "c": "1", "d": 1, "only_b": 0},
    )
    assert [(d.path, d.kind, d.detail) for d in result.differences] == [
        ("a", "shape", "shape [2] vs [3]"),
        ("b", "dtype", "dtype torch.float32 vs torch.float64"),
        ("c", "type", "int vs str"),
        ("only_a", "keys", "only in A"),
        ("only_b", "keys", "only in B"),
    ]


# -- output ------------------------------------------------------------------------------------------
def test_the_json_report_has_its_schema_version_and_survives_strict_json(jpath):
    changed = batch(7)
    changed["old_log_probs"][1, 1] = float("inf")
    first, second = two_sessions(jpath, {7: changed})
    with Journal(jpath, readonly=True) as journal:
        report = diff_journals(journal, journal, session_a=first, session_b=second)
    data = json.loads(json.dumps(report.to_json(), allow_nan=False))
    assert data["schema_version"] == DIFF_SCHEMA_VERSION == 2
    assert data["exit_code"] == 1 and data["counts"]["differing"] == 1
    assert data["first_divergence"]["step"] == 7 and data["first_divergence"]["max_abs"] == "inf"
    assert data["first_divergence"]["comparison"]["differences"][0]["position"] == [1, 1]
    assert data["a"]["session"] == first and data["b"]["session"] == second
    assert data["a"]["selects"] == data["b"]["selects"] == "session"


# -- the command line --------------------------------------------------------------------------------
# Through the real entry point, as a user runs it: `python -m stepjournal diff ...`.
def stepjournal_diff(*argv: str) -> subprocess.CompletedProcess:
    return run_cli("diff", *argv, env={"COLUMNS": "100"})


# Several command lines in one process, each through `main` (a fresh interpreter costs seconds).
_CLI_MANY = (
    "import contextlib, io, json, sys\n"
    "from stepjournal.adapters.cli import main\n"
    "results = []\n"
    "for argv in json.loads(sys.argv[1]):\n"
    "    out, err = io.StringIO(), io.StringIO()\n"
    "    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):\n"
    "        code = main(argv)\n"
    "    results.append([code, out.getvalue(), err.getvalue()])\n"
    "print(json.dumps(results))\n"
)


def stepjournal_diffs(*argvs: tuple) -> list:
    """Run several `stepjournal diff` command lines in one fresh process: [(exit status, stdout, stderr)]."""
    done = subprocess.run([sys.executable, "-c", _CLI_MANY, json.dumps([["diff", *a] for a in argvs])],
                          capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "COLUMNS": "100"})
    return json.loads(done.stdout)


def test_cli_exit_status_is_0_when_equal_1_when_different_2_on_bad_input(jpath, tmp_path):
    first, second = two_sessions(jpath, {7: batch(7, reward_flip=True)})
    equal = stepjournal_diff(jpath, jpath, "--session-a", first, "--session-b", second, "--steps", "1-6")
    assert equal.returncode == 0, equal.stderr
    assert equal.stdout.startswith("runs agree: 6 pairs over steps 1-6 are equal")
    differ = stepjournal_diff(jpath, jpath, "--session-a", first, "--session-b", second[:6])
    assert differ.returncode == 1, differ.stderr
    lines = differ.stdout.splitlines()
    assert lines[0].startswith("runs agree through step 6; at step 7 the first differing stage is generate")
    assert all(len(line) <= 100 for line in lines if jpath not in line)  # A: and B: keep their paths whole
    assert any("DIFFERS" in line and "reward sample 2: 0 vs 1 (rel 1)" in line for line in lines)
    sides = (jpath, jpath, "--session-a", first, "--session-b", second)
    cases = {
        "--tol 'reward': write FIELD=ATOL": sides + ("--tol", "reward"),
        "tolerance for 'nothing': no such field": sides + ("--tol", "nothing=1e-3", "--steps", "7"),
        "the runs share no step": sides + ("--steps", "9-"),
        "--plot x.gif: name a .png, .svg or .html file": sides + ("--plot", "x.gif"),
        "does not exist": (jpath, str(tmp_path / "nowhere")),
    }
    for message, (code, _, err) in zip(cases, stepjournal_diffs(*cases.values())):
        assert code == 2 and message in " ".join(err.split()), (message, err)


def test_cli_json_and_plots(jpath, tmp_path):
    first, second = two_sessions(jpath, {7: batch(7, lp_shift=1e-3), 8: batch(8, reward_flip=True)})
    png, page = str(tmp_path / "d.png"), str(tmp_path / "d.html")
    done = stepjournal_diff(jpath, jpath, "--session-a", first, "--session-b", second, "--tol", "old_log_probs=1e-2",
                            "--json", "--plot", png)
    assert done.returncode == 1, done.stderr
    data = json.loads(done.stdout)
    assert data["schema_version"] == 2 and data["tolerances"]["fields"] == {"old_log_probs": {"atol": 0.01, "rtol": 0.0}}
    assert [p["state"] for p in data["pairs"]][6:] == ["within_tolerance", "differing"]
    with open(png, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"
    shown = stepjournal_diff(jpath, jpath, "--session-a", first, "--session-b", second, "--plot", page)
    assert shown.returncode == 1 and f"wrote {page}" in shown.stdout.splitlines()
    text = open(page, encoding="utf-8").read()
    assert text.count('<td class="equal"') == 6 and text.count('<td class="differing"') == 2
    assert "runs agree through step 6" in text and ">1.0e-03</td>" in text
