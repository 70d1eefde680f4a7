"""A line that names a path goes through `_render.print_line`: the terminal wraps it, so a copied path is one piece."""

from __future__ import annotations

import io
import pathlib

from stepjournal.adapters.cli._render import make_console, print_line  # private: a CLI helper under test

CLI = pathlib.Path(__file__).resolve().parents[2] / "adapters" / "cli"


def test_print_line_keeps_a_path_wider_than_the_console_on_one_line():
    buffer = io.StringIO()
    console = make_console(file=buffer, width=20, force_terminal=False)
    path = "/tmp/" + "deep/" * 12 + "journal"
    print_line(console, f"runs in {path}")
    console.print(f"runs in {path}")  # rich's own wrapping, for contrast
    whole, *broken = buffer.getvalue().splitlines()
    assert whole == f"runs in {path}"
    assert len(broken) > 1 and all(len(line) <= 20 for line in broken)  # what a path line looked like before


def test_no_verb_chooses_soft_wrapping_itself():
    """One place decides how a path line is printed; a verb that passes soft_wrap itself is told where it lives."""
    choosers = sorted(p.name for p in CLI.glob("*.py") if p.name != "_render.py" and "soft_wrap" in p.read_text())
    assert choosers == [], f"{choosers}: print a line that names a path with _render.print_line"
