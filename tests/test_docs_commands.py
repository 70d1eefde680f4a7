"""docs/audit.md's command lines on the demo journal, run through a shell as typed, with their output as
the page shows it.

`make demo` writes ``.stepjournal-demo``; every ``$ `` line of the page that names it runs in a folder
holding a fresh one. Where the page shows output under a line, the output must match it, line by line:
runs of blanks count as one, a date and time stands for any, ``…`` for any text (a host, a cell cut to
its column), and a last line ``...`` for the lines the page leaves out.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

AUDIT = Path(__file__).resolve().parent.parent / "docs" / "audit.md"
DEMO = ".stepjournal-demo"


def demo_commands() -> list[tuple[str, list[str]]]:
    """(command, the output lines the page shows under it) of each ``$ `` line naming the demo journal."""
    found: list[tuple[str, list[str]]] = []
    for block in re.findall(r"^```console\n(.*?)^```", AUDIT.read_text(encoding="utf-8"), re.S | re.M):
        current = None
        for line in block.splitlines():
            if line.startswith("$ "):
                current = (line[2:], []) if DEMO in line else None
                if current:
                    found.append(current)
            elif current is not None:
                current[1].append(line)
    return found


# A time of day changes from run to run: on both sides, each is read as "some time".
_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)?")


def matches(expected: str, got: str) -> bool:
    expected, got = _TIME.sub("<time>", expected), _TIME.sub("<time>", got)
    pattern = ".*?".join(re.escape(" ".join(part.split())) for part in expected.split("…"))
    return re.fullmatch(pattern, " ".join(got.split())) is not None


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


@pytest.mark.parametrize("command,shown", demo_commands(), ids=[c for c, _ in demo_commands()])
def test_each_demo_command_runs_as_typed_and_prints_what_the_page_shows(folder, command, shown):
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    env.pop("COLUMNS", None)
    done = subprocess.run(["bash", "-c", command], cwd=folder, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    if not shown:
        return
    got = done.stdout.rstrip("\n").splitlines()
    if shown[-1] == "...":
        shown, got = shown[:-1], got[:len(shown) - 1]
    assert len(got) == len(shown), (shown, got)
    for expected, line in zip(shown, got):
        assert matches(expected, line), (expected, line)
