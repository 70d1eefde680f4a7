"""The table verbs in a pseudo-terminal of 80 and 120 columns (its window size set as a terminal sets it, no
COLUMNS): each line fits, the free-text column (audit's reason, runs' fingerprint) gets the width, ``--wide``
overflows instead of squeezing, a pipe takes the width of the terminal it ends in, and ``diff`` shows numbers
at four digits with their relative difference.

Every command runs in a process of its own (`cli_support.start_cli`), in the journal's folder, so a path
never decides a line's width.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from stepjournal import Journal
from cli_support import run_cli, start_cli
from terminal import on_a_terminal, shown, terminal_env

SETTINGS = {"cache_implementation": "static", "model": "Qwen/Qwen2.5-0.5B-Instruct", "batch": 8, "attn": "sdpa"}
RECORDED = "dump: step {} is in steps 1-20, generate and store the output for the replay"
REPEATED = "repeat: step {} -> recorded step {} of 5 in steps 1-5"


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """``j``: session s1 records steps 1-20 (temperature 1.0) and a metrics call a step; s2, another run
    (temperature 0.7), replays and repeats them into steps 21-40. ``j2``: a copy whose step 3 reward differs
    in its 17th digit and step 4's by a tenth."""
    here = tmp_path_factory.mktemp("tables")
    path = str(here / "j")
    with Journal(path, run="baseline", fingerprint={**SETTINGS, "temperature": 1.0}) as j:
        for step in range(1, 21):
            j.record(step, {"ids": torch.full((2, 3), step), "reward": torch.tensor([0.1, 0.2], dtype=torch.float64)},
                     policy="dump@1-20", reason=RECORDED.format(step))
            j.record(step, {"loss": 0.5}, stage="metrics", policy="dump@1-20", reason="metrics of the step")
    with Journal(path, run="temperature-sweep", fingerprint={**SETTINGS, "temperature": 0.7}) as j:
        for step in range(21, 41):
            source = (step - 21) % 5 + 1
            j.record_replay(step, j.lookup(source, run="baseline"), policy="repeat", reason=REPEATED.format(step, source))
    with Journal(str(here / "j2"), run="baseline", fingerprint={**SETTINGS, "temperature": 1.0}) as j:
        for step in range(1, 6):
            reward = {3: [0.1, math.nextafter(0.2, 1)], 4: [0.1, 0.22]}.get(step, [0.1, 0.2])
            j.record(step, {"ids": torch.full((2, 3), step), "reward": torch.tensor(reward, dtype=torch.float64)},
                     policy="dump@1-20", reason=RECORDED.format(step))
    return here


def in_terminal(folder: Path, columns: int, *args: str, pipe: bool = False) -> str:
    """``stepjournal ARGS`` in `folder`, on a pseudo-terminal `columns` wide (`terminal.on_a_terminal`), its lines
    as the terminal shows them. With `pipe`, stdout is a pipe and only stdin and stderr are the terminal
    (``stepjournal runs j | head``)."""
    cwd = os.getcwd()
    os.chdir(folder)  # start_cli runs the command in this process's folder
    try:
        status, raw = on_a_terminal(lambda i, o, e: start_cli(*args, stdin=i, stdout=o, stderr=e, env=terminal_env()),
                                    columns=columns, pipe=pipe, timeout=120)
    finally:
        os.chdir(cwd)
    assert status in (0, 1), (args, shown(raw))
    return shown(raw)


def rows_of(lines: list[str]) -> list[str]:
    """The table rows of an audit view: the lines that start with a step number and a call (``#0``)."""
    return [line for line in lines if re.match(r"^\s*\d+\s+\S*#\d", line)]


# -- every table verb fits ---------------------------------------------------------------------------------
@pytest.mark.parametrize("columns", [80, 120])
def test_each_table_verb_fits_the_terminal_with_the_reason_and_the_differing_key(folder, columns, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(folder / "j2", damaged)
    from lmdb_raw import flip_byte

    with Journal(str(damaged), readonly=True) as journal:
        digest = journal.lookup(2, run="baseline").event.output.digest
    flip_byte(str(damaged), "payloads", key=bytes.fromhex(digest))
    views = {
        "runs": ["runs", "j"], "audit": ["audit", "j"], "audit --summary": ["audit", "j", "--summary"],
        "diff": ["diff", "j", "j2", "--run-a", "baseline", "--steps", "1-5", "--stage", "generate"],
        "verify": ["verify", str(damaged)], "status": ["status", "j", (tmp_path / "remote").as_uri()],
    }
    shown = {}
    for view, argv in views.items():
        shown[view] = in_terminal(folder, columns, *argv).splitlines()
        lines = [line for line in shown[view] if str(tmp_path) not in line]  # a path stays whole, to copy
        assert len(lines) >= 2 and max(map(len, lines)) <= columns, (view, max(lines, key=len))
    # The reason gets the width: whole at 120; at 80, 3/8 of the line at least (30 characters), its end cut
    # with an ellipsis, where a fixed column that is too wide gives way (today: 18 characters).
    (step_25,) = [line for line in rows_of(shown["audit"]) if line.split()[0] == "25"]
    reason = REPEATED.format(25, 5)
    if columns == 120:
        assert step_25.endswith(reason), step_25
    else:
        assert reason[:29] in step_25 and step_25.endswith("…"), step_25
    # The fingerprint column names the one key that differs between the sessions, not the first key.
    sessions = [line for line in shown["runs"] if re.match(r"^s[12] ", line)]
    assert len(sessions) == 2 and "temperature=1.0" in sessions[0] and "temperature=0.7" in sessions[1], sessions
    assert not any("cache_implementation" in line or "model=" in line for line in sessions), sessions
    assert "fingerprint: the key that differs between sessions; --wide shows all 5" in shown["runs"]
    assert shown["verify"][-1].startswith("journal is damaged")


def test_a_fixed_column_takes_what_it_needs_and_the_reason_the_rest(folder):
    lines = in_terminal(folder, 80, "audit", "j", "--stage", "generate").splitlines()
    header, rule = lines[1], lines[2]
    assert header.split() == ["step", "call", "action", "source", "policy", "sess", "reason"]
    # step: 4 columns ("step"), call: 4 ("call", "#0"), action: 9 ("generated"); two spaces between columns.
    assert header.startswith("step  call  action     source"), header
    assert len(rule) == 80 and len(rule) - header.index("reason") >= 30  # the reason fills the rest


# -- --wide overflows ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("verb", ["audit", "runs"])
def test_wide_lines_overflow_the_terminal_unbroken_and_uncut(folder, verb):
    lines = in_terminal(folder, 80, verb, "j", "--wide").splitlines()
    assert max(map(len, lines)) > 80
    assert not any("…" in line for line in lines), [line for line in lines if "…" in line][:2]
    if verb == "audit":
        rows = [line for line in lines if re.match(r"^\s*\d+\s+s[12]\s", line)]
        assert len(rows) == 60 and lines[-1] == "60 calls"  # one line per call: nothing wrapped
        (step_25,) = [line for line in rows if line.split()[5] == "25"]
        assert REPEATED.format(25, 5) in step_25 and re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$", step_25)
    else:
        sessions = [line for line in lines if re.match(r"^s[12] ", line)]
        assert len(sessions) == 2 and all("cache_implementation=static" in line for line in sessions), sessions
        assert all(line.rstrip().endswith(("temperature=1.0", "temperature=0.7")) for line in sessions), sessions


# -- a pipe's width -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("columns", [80, 120])
def test_a_pipe_gets_the_width_of_the_terminal_it_ends_in(folder, columns):
    """``stepjournal audit j | head``: stdout is a pipe, stderr and stdin the terminal."""
    lines = in_terminal(folder, columns, "audit", "j", pipe=True).splitlines()
    assert max(map(len, lines)) == columns, max(lines, key=len)
    assert not any(line != line.rstrip() for line in lines)  # and no padding reaches the pipe
    runs = in_terminal(folder, columns, "runs", "j", pipe=True).splitlines()
    assert max(map(len, runs)) <= columns


def test_with_no_terminal_at_all_a_table_is_as_wide_as_its_cells_and_columns_is_honoured(folder):
    """A file, cron, CI: up to 200 columns, each reason whole, and no wider than the widest row."""
    alone = run_cli("audit", str(folder / "j"), "--stage", "generate", env={"COLUMNS": None})
    lines = alone.stdout.splitlines()
    rule, rows = lines[2], rows_of(lines)
    assert alone.returncode == 0 and len(rule) == max(map(len, rows)) < 200, rule
    (step_25,) = [line for line in rows if line.split()[0] == "25"]
    assert step_25.endswith(REPEATED.format(25, 5)), step_25
    narrow = run_cli("audit", str(folder / "j"), "--stage", "generate", env={"COLUMNS": "80"}).stdout.splitlines()
    assert max(map(len, narrow[1:])) == 80


# -- audit says what it lists ------------------------------------------------------------------------------
def test_the_audit_title_names_the_stages_listed_and_the_newest_calls(folder):
    lines = in_terminal(folder, 120, "audit", "j", "-n", "3").splitlines()
    assert lines[0] == "the newest 3 of the generate and metrics calls in j"
    assert [line.split()[0] for line in rows_of(lines)] == ["38", "39", "40"]
    only = in_terminal(folder, 120, "audit", "j", "--stage", "metrics", "--first", "2").splitlines()
    assert only[0] == "the oldest 2 of the metrics calls in j" and only[-1] == "2 calls"
    none = in_terminal(folder, 120, "audit", "j", "--stage", "reward", "--run", "baseline").splitlines()
    assert none[0] == "reward calls (run baseline) in j" and none[-1] == "no reward call matches"


# -- diff's numbers ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("columns", [80, 120])
def test_diff_shows_numbers_at_four_digits_with_their_relative_difference(folder, columns):
    shown = in_terminal(folder, columns, "diff", "j", "j2", "--run-a", "baseline", "--steps", "1-5", "--stage", "generate")
    lines = shown.splitlines()
    assert not re.search(r"\d\.\d{6,}", shown), shown  # no float of 17 digits, anywhere
    (step_3,) = [line for line in lines if line.split()[:2] == ["3", "generate"]]
    assert re.search(r"0\.2 vs 0\.2 \(rel [\d.]+e-16\)$", step_3), step_3  # alike in 4 digits, 1e-16 apart
    (step_4,) = [line for line in lines if line.split()[:2] == ["4", "generate"]]
    assert "0.02" in step_4.split() and step_4.endswith("0.2 vs 0.22 (rel 0.091)"), step_4
    assert "(reward sample 1: 0.2 vs 0.22 (rel 0.091))" in shown.replace("\n", " ")  # the summary line too
