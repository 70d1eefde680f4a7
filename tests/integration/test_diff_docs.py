"""docs/diff.md's example, typed as the page shows it: ``docs/diff_example.py``'s journal (a recorded run
and a replay that changed a few steps) in a folder named ``journal``, and the page's diff line run there
through a shell, printing what the page shows and drawing the picture."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from doc_lines import command_lines, matches, run_line, shown_under

ROOT = Path(__file__).resolve().parents[2]
DOC_LINES = [line for line in command_lines("docs/diff.md") if line.text.startswith("stepjournal diff journal journal ")]


def test_the_example_diff_prints_what_the_page_shows_and_draws_its_picture(tmp_path):
    spec = importlib.util.spec_from_file_location("diff_example", ROOT / "docs" / "diff_example.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.build(str(tmp_path / "journal"))
    (tmp_path / "docs").mkdir()
    (line,) = DOC_LINES
    done = run_line(line.text, tmp_path, env={"COLUMNS": "100"})
    assert done.returncode == 1, done.stderr  # the runs differ
    shown = shown_under(line)
    got = done.stdout.rstrip("\n").splitlines()
    assert len(got) == len(shown) and all(map(matches, shown, got)), got
    assert (tmp_path / "docs" / "diff-example.png").stat().st_size > 10_000
