"""`make demo`'s program: records steps 1-6, then serves every call of a second run from the journal."""

from __future__ import annotations

import subprocess
import sys

from stepjournal import Journal


def test_demo_prints_generated_and_replayed_calls_and_run_two_generates_nothing(tmp_path):
    path = str(tmp_path / "demo-journal")
    result = subprocess.run(
        [sys.executable, "-m", "stepjournal.adapters.demo", "--path", path],
        capture_output=True, text=True, timeout=300, env={"COLUMNS": "120", "PATH": ""},
    )
    assert result.returncode == 0, result.stderr
    assert "generated" in result.stdout and "replayed" in result.stdout and "step 1 call 0" in result.stdout
    # Sessions by the one name every verb shows them by: s1 recorded, s2 replayed.
    rows = [line.split("│")[1:3] for line in result.stdout.splitlines() if line.startswith("│")]
    assert {(session.strip(), step.strip()) for session, step in rows} >= {("s1", "1"), ("s2", "8")}
    with Journal(path, readonly=True) as journal:
        records = journal.audit()
    first, second = records[0].session, records[-1].session
    assert [r.action for r in records if r.session == first] == ["generated"] * 7
    assert [r.action for r in records if r.session == second] == ["replayed"] * 9
    assert [r.source_step for r in records if r.session == second] == [1, 2, 3, 4, 4, 5, 6, 1, 2]


def test_the_demos_closing_hint_runs_as_printed_through_a_shell(tmp_path):
    """The printed audit command is one unwrapped line that a shell runs from the same folder."""
    result = subprocess.run(
        [sys.executable, "-m", "stepjournal.adapters.demo", "--path", "./demo-journal"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env={"COLUMNS": "60", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    (hint,) = [line for line in result.stdout.splitlines() if "inspect the journal with:" in line]
    command = hint.split("inspect the journal with: ", 1)[1]
    assert command.endswith("audit ./demo-journal")
    audit = subprocess.run(
        ["bash", "-c", command], capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={"COLUMNS": "120", "PATH": "/usr/bin:/bin"},
    )
    assert audit.returncode == 0, audit.stderr
    assert "replayed" in audit.stdout
