"""The tool-call views on the command line at their edges: what a broken or hostile tool answers (a NaN reward, an
infinite metric, terminal escapes and rich markup in its name, arguments and text), and a journal of several runs."""

from __future__ import annotations

import json

import pytest

from cli_support import run_cli
from stepjournal import Journal
from stepjournal.tools import first_tool_difference, tool_call_rows
from stepjournal.events import ToolResponse
from stepjournal.adapters import journaled_tool


def judge(answer: str) -> ToolResponse:
    """A judge that could not score the answer: its reward is NaN, and a metric an infinity."""
    return ToolResponse("\x1b]0;pwned\x07\x1b[31mscored [bold]nothing[/]", reward=float("nan"),
                        metrics={"confidence": float("inf"), "scores": [float("nan")]})


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("hostile") / "journal")
    with Journal(path) as journal:
        journaled_tool(judge, journal, "judge[/]\x1b[2J").at(step=1, sample=0)(answer="\x1b[2J[red]42[/]")
    return path


def test_audit_and_show_json_write_a_nan_reward_as_json_can_hold_it(judged):
    for command in (("audit", judged, "--tools", "--json"), ("show", judged, "1", "--text", "--sample", "0", "--json")):
        done = run_cli(*command)
        assert done.returncode == 0, done.stderr
        parsed = json.loads(done.stdout)
        (row,) = parsed["calls"] if isinstance(parsed, dict) else parsed
        assert row["reward"] == "nan"


def test_a_journal_diffed_with_itself_has_the_same_tool_responses_nan_and_all(judged):
    with Journal(judged, readonly=True) as journal:
        rows = tool_call_rows(journal)
    assert first_tool_difference(rows, rows) is None
    done = run_cli("diff", judged, judged, "--tools")
    assert done.returncode == 0 and "the same" in done.stdout, done.stdout



def test_diff_tools_of_a_journal_of_several_runs_asks_which_run_and_compares_that_one(tmp_path):
    """Each side's latest answer per key was taken across every run (and mode), so one run's calls were compared
    with another run's."""
    answers = iter(["first", "second", "first"])

    def search(query: str) -> str:
        return next(answers)  # another answer each time it runs

    both, one = str(tmp_path / "both"), str(tmp_path / "one")
    for path, runs in ((both, ("x", "y")), (one, ("x",))):
        for run in runs:
            with Journal(path, run=run) as journal:
                journaled_tool(search, journal, "search", "dump").at(step=1, sample=0)(query="q")
    done = run_cli("diff", both, one, "--tools")
    assert done.returncode == 2 and "several runs (x, y)" in done.stderr and "--run-a" in done.stderr, done
    done = run_cli("diff", both, one, "--tools", "--run-a", "x")
    assert done.returncode == 0 and "the same" in done.stdout, done
    assert run_cli("diff", both, one, "--tools", "--run-a", "y").returncode == 1
    for only in (("--mode", "validate"), ("--stage", "tool.other")):  # were left unread: 1, the train calls differ
        done = run_cli("diff", both, one, "--tools", "--run-a", "y", *only)
        assert done.returncode == 0 and "(0 and 0 tool call events)" in done.stdout, done
