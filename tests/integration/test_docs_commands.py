"""docs/audit.md's command lines on the demo journal, run through a shell as typed, with their output as
the page shows it; and its ``stepjournal verify damaged-journal``, on the demo journal damaged as the
page's table says (a broken event body at step 2, a flipped payload byte at step 3).

`make demo` writes ``.stepjournal-demo``; every ``$ `` line of the page that names it runs in a folder
holding a fresh one. Where the page shows output under a line, the output must match it, line by line:
runs of blanks count as one, a date and time stands for any, ``…`` for any text (a host, a cell cut to
its column), and a last line ``...`` for the lines the page leaves out.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from doc_lines import command_lines, matches, prompted_lines, run_line, shown_under

AUDIT = Path(__file__).resolve().parents[2] / "docs" / "audit.md"
DEMO = ".stepjournal-demo"
DAMAGED = "stepjournal verify damaged-journal"
DOC_LINES = [line for line in command_lines("docs/audit.md") if DEMO in line.text or line.text == DAMAGED]


def demo_commands() -> list[tuple[str, list[str]]]:
    """(command, the output lines the page shows under it) of each ``$ `` line naming the demo journal."""
    blocks = re.findall(r"^```console\n(.*?)^```", AUDIT.read_text(encoding="utf-8"), re.S | re.M)
    return [(command, shown) for body in blocks for command, shown in prompted_lines(body) if DEMO in command]


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    here = tmp_path_factory.mktemp("docs-demo")
    made = subprocess.run([sys.executable, "-m", "stepjournal.adapters.demo"], cwd=here, capture_output=True,
                          text=True, timeout=600)
    assert made.returncode == 0 and (here / DEMO / "data.mdb").exists(), made.stderr
    return here


def test_the_page_has_demo_commands_with_output():
    commands = demo_commands()
    assert len(commands) >= 9 and sum(bool(shown) for _, shown in commands) >= 4
    assert [command for command, _ in commands] == [line.text for line in DOC_LINES if line.text != DAMAGED]


@pytest.mark.parametrize("command,shown", demo_commands(), ids=[c for c, _ in demo_commands()])
def test_each_demo_command_runs_as_typed_and_prints_what_the_page_shows(folder, command, shown):
    done = run_line(command, folder, env={"COLUMNS": None})
    assert done.returncode == 0, done.stderr
    if not shown:
        return
    got = done.stdout.rstrip("\n").splitlines()
    if shown[-1] == "...":
        shown, got = shown[:-1], got[:len(shown) - 1]
    assert len(got) == len(shown), (shown, got)
    for expected, line in zip(shown, got):
        assert matches(expected, line), (expected, line)


def test_verify_of_the_damaged_demo_journal_prints_what_the_page_shows(folder, tmp_path):
    import msgpack

    from lmdb_raw import flip_byte, items, put_raw
    from stepjournal import Journal

    damaged = shutil.copytree(folder / DEMO, tmp_path / "damaged-journal")
    with Journal(str(damaged), readonly=True) as journal:
        seq = journal.lookup(2, run="demo").seq
        digest = journal.lookup(3, run="demo").event.output.digest
    key = seq.to_bytes(8, "big")
    body = msgpack.unpackb(dict(items(str(damaged), "events"))[key])
    body["policy"] = 5  # a number where the schema says string
    put_raw(str(damaged), "events", key, msgpack.packb(body))
    flip_byte(str(damaged), "payloads", key=bytes.fromhex(digest))
    (line,) = [line for line in DOC_LINES if line.text == DAMAGED]
    shown = shown_under(line)
    done = run_line(DAMAGED, tmp_path, env={"COLUMNS": None})
    assert done.returncode == 1, done.stderr
    got = done.stdout.rstrip("\n").splitlines()
    assert len(got) == len(shown) and all(matches(e, g) for e, g in zip(shown, got)), got
