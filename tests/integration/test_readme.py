"""The README's first minutes, as typed: a user's start (`make demo`, then reading the demo's journal) apart
from a contributor's `make test`.

The reading lines run in a folder where the demo ran (``python -m stepjournal.adapters.demo``, what `make
demo` runs once its venv is there; tests/e2e/test_docs_install.py types `make demo` itself in a fresh clone).
The activation line runs in the repository, whose ``.venv`` the suite runs from.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is the project's folder, not installed
from benchmarks._cli_start import DEMO, make_demo  # noqa: E402
from doc_lines import FENCE, command_lines, run_line

ROOT = Path(__file__).resolve().parents[2]
USER_START = "Try it: the demo, then read its journal"
CONTRIBUTING = "Contributing"
ACTIVATE = "source .venv/bin/activate"
READING = [line for line in command_lines("README.md", section=USER_START) if line.text.startswith("stepjournal ")]
DOC_LINES = READING + [line for line in command_lines("README.md", section=USER_START) if line.text == ACTIVATE]

# What each reading line must leave, beside its exit status 0: a word of its output, or the file it writes.
SHOWS = {"show": "step 1", "audit": "replayed"}


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """A folder where the demo ran (as `make bench` makes it for its start-up figures)."""
    here = tmp_path_factory.mktemp("readme-demo")
    make_demo(here)
    return here


def test_the_user_starts_with_the_demo_and_its_reading_and_make_test_is_the_contributors():
    user = [line.text for line in command_lines("README.md", section=USER_START)]
    assert user[:2] == ["make demo", ACTIVATE]
    assert [text.split()[1] for text in user[2:]] == ["show", "report", "audit"]
    assert all(DEMO in text for text in user[2:])
    contributor = [line.text for line in command_lines("README.md", section=CONTRIBUTING)]
    assert "make test" in contributor and "make test" not in user
    first = [line for line in command_lines("README.md")][:len(user)]
    assert [line.text for line in first] == user  # the user's start comes first on the page


def test_each_line_of_the_users_start_says_what_it_does():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index(f"## {USER_START}"):text.index(f"## {CONTRIBUTING}")]
    block = next(FENCE.finditer(section))["body"]
    typed = [row for row in block.splitlines() if row.strip()]
    assert len(typed) == 5 and all("  # " in row for row in typed), typed


def test_the_activation_line_puts_the_venvs_stepjournal_first_on_path():
    done = run_line(f'{ACTIVATE} && command -v stepjournal && echo "$VIRTUAL_ENV"', ROOT)
    assert done.returncode == 0, done.stderr
    found, venv = done.stdout.split()
    assert Path(found) == Path(venv) / "bin" / "stepjournal"


@pytest.mark.parametrize("line", READING, ids=[line.text for line in READING])
def test_each_reading_line_runs_as_typed_on_the_demo_journal(folder, line):
    done = run_line(line.text, folder, env={"COLUMNS": "80"})
    assert done.returncode == 0, (line.text, done.stderr)
    verb = line.text.split()[1]
    if verb == "report":
        written = folder / line.text.split("-o ", 1)[1].split()[0]
        assert written.read_text(encoding="utf-8").lstrip().lower().startswith("<!doctype html"), line.text
    else:
        assert SHOWS[verb] in done.stdout, (line.text, done.stdout[-2000:])
