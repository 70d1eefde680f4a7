"""`FittedColumns`, the widths of the command line's one-line-per-row tables, drawn by rich as the verbs draw them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from stepjournal.adapters.cli._render import FittedColumns  # private: a CLI helper under test

COLUMNS = (("step", "right", 12), ("call", "left", 16), ("action", "left", 9), ("policy", "left", 16),
           ("reason", "left", None))
WHOLE = ("step", "action")


def drawn(layout: FittedColumns, rows: list[list[str]], width: int) -> list[str]:
    table = layout.table()
    for row in rows:
        table.add_row(*row)
    console = Console(width=width, color_system=None)
    with console.capture() as captured:
        console.print(table)
    return captured.get().splitlines()


def test_a_table_that_fits_takes_what_its_cells_need():
    layout = FittedColumns(80, COLUMNS)
    layout.measure([["7", "#0", "replayed", "repeat", "repeat: step 7"]])
    assert layout.widths() == [4, 4, 8, 6, 14]


def test_a_long_reason_keeps_three_eighths_of_the_line_and_the_widest_fixed_column_gives_way():
    layout = FittedColumns(80, COLUMNS, whole=WHOLE)
    row = ["40", "metrics#0", "generated", "a-policy-named-at-length@1-20", "x" * 200]
    layout.measure([row])
    widths = layout.widths()
    assert widths[4] >= 30 and widths[0] == 4 and widths[2] == 9  # step and action never cut
    assert sum(w + 2 for w in widths) - 2 == 80
    (line,) = drawn(layout, [row], 80)[2:]
    assert len(line) == 80 and line.startswith("  40  metrics#0  generated") and line.endswith("x…")


def test_what_the_free_text_does_not_need_goes_back_to_a_fixed_column_that_was_cut():
    layout = FittedColumns(80, (("run", "left", 24), ("fingerprint", "left", None)))
    layout.measure([["r" * 70, "lr=0.1"]])
    assert layout.widths() == [80 - 2 - 11, 11]  # the fingerprint needs its header's 11: the run takes the rest


@given(st.integers(40, 200), st.lists(st.tuples(st.integers(0, 10 ** 9), st.text("abc#@- ", max_size=40),
                                                st.sampled_from(["generated", "replayed", "refused"]),
                                                st.text("abcd@-", max_size=30), st.text("abc ", max_size=300)),
                                      min_size=1, max_size=5))
def test_no_line_is_wider_than_the_terminal_and_no_step_or_action_is_cut(width, rows):
    texts = [[str(step), call, action, policy, reason] for step, call, action, policy, reason in rows]
    layout = FittedColumns(width, COLUMNS, whole=WHOLE)
    layout.measure(texts)
    lines = drawn(layout, texts, width)
    assert all(len(line) <= width for line in lines)
    for line, (step, _, action, _, _) in zip(lines[2:], rows):
        assert line.split()[0] == str(step) and f"  {action}" in line
