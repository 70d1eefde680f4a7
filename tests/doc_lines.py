"""The command lines of the docs, as a reader would type them: one source for every test that runs them.

A command line is a ``$ `` line of a fenced block, or, in a ```console / ```bash block with no ``$ ``
line, every line that is not blank or a comment. A line ending in ``\\`` continues on the next one (the
lines are joined, as the shell joins them); a comment after two spaces (``cmd   # what it does``) is
the page's note, not the command. ```python, ```json, ```yaml and ```toml blocks hold no command lines
(tests/integration/test_docs.py runs the python ones).

Each test that runs lines of a page takes them from here and names them in its module's ``DOC_LINES``;
tests/unit/test_docs_lines.py checks that every line of every page is run by one of them, or, for the lines
that are not meant to be typed as they stand (a synopsis, a placeholder), checked another way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parent.parent
PAGES = ["README.md"] + sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>[^\n]*)\n(?P<body>.*?)^(?P=indent)```", re.S | re.M)
NOT_COMMANDS = ("python", "json", "yaml", "toml")
SHELL_BLOCKS = ("console", "bash", "sh", "shell")
_NOTE = re.compile(r"\s{2,}#.*$")


@dataclass(frozen=True)
class DocLine:
    """One command line of a page: the page (``docs/audit.md``), the line it starts on, and its text."""

    page: str
    number: int
    text: str

    def __str__(self) -> str:
        return f"{self.page}:{self.number}: {self.text}"


def block_lines(info: str, body: str) -> List[tuple]:
    """(offset in the block, command text) of each command line of one fenced block."""
    lines = body.splitlines()
    prompted = any(line.strip().startswith("$ ") for line in lines)
    if not prompted and (info.split() or [""])[0] not in SHELL_BLOCKS:
        return []  # a picture of output or of a file, not lines to type
    found, current, start = [], None, 0
    for offset, line in enumerate(lines):
        stripped = line.strip()
        if current is not None:  # the previous line ended in a backslash
            current += " " + stripped
        elif prompted and stripped.startswith("$ "):
            current, start = stripped[2:], offset
        elif not prompted and stripped and not stripped.startswith("#"):
            current, start = stripped, offset
        else:
            continue
        if current.endswith("\\"):
            current = current[:-1].rstrip()
            continue
        found.append((start, _NOTE.sub("", current).strip()))
        current = None
    return found


def command_lines(page: Optional[str] = None, *, section: Optional[str] = None) -> List[DocLine]:
    """Every command line of `page` (all pages when None), in page order; with `section`, only those under
    that heading (up to the next heading of the same or a higher level)."""
    found: List[DocLine] = []
    for name in [page] if page else PAGES:
        text = (ROOT / name).read_text(encoding="utf-8")
        lo, hi = _section_span(text, section) if section else (0, len(text))
        for block in FENCE.finditer(text):
            info = block["info"].strip()
            if not lo <= block.start() < hi or (info.split() or [""])[0] in NOT_COMMANDS:
                continue
            first = text.count("\n", 0, block.start()) + 2  # the block's first line, 1-based
            found += [DocLine(name, first + offset, line) for offset, line in block_lines(info, block["body"])]
    return found


def _section_span(text: str, heading: str) -> tuple:
    match = re.search(rf"^(#+) {re.escape(heading)}\s*$", text, re.M)
    if not match:
        raise ValueError(f"no heading {heading!r}")
    end = re.compile(rf"^#{{1,{len(match[1])}}} ", re.M).search(text, match.end())
    return match.start(), end.start() if end else len(text)


def run_line(text: str, cwd, *, env: Optional[dict] = None, timeout: float = 600):
    """`text` through bash in `cwd`, as typed, with this interpreter's ``bin`` first on PATH (so
    ``stepjournal`` and ``python`` are the ones under test); ``env`` adds to (None removes from) this
    process's environment. Output captured as text."""
    import os
    import subprocess
    import sys

    merged = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    for key, value in (env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return subprocess.run(["bash", "-c", text], cwd=cwd, env=merged, capture_output=True, text=True,
                          timeout=timeout)  # a hang detector only


def typed_in_terminal(text: str, cwd, *, columns: int = 80, env: Optional[dict] = None, timeout: float = 900):
    """`text` through bash in `cwd`, as typed at a terminal `columns` wide (`terminal.on_a_terminal`: stdin, stdout
    and stderr one pseudo-terminal, no COLUMNS, PAGER=cat), with this interpreter's ``bin`` first on PATH. Returns
    (exit status, what the terminal showed: its lines, colours and carriage-return redraws left out)."""
    import os
    import subprocess
    import sys

    from terminal import on_a_terminal, shown, terminal_env

    merged = terminal_env({"PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}", **(env or {})})
    status, raw = on_a_terminal(
        lambda stdin, stdout, stderr: subprocess.Popen(["bash", "-c", text], cwd=cwd, env=merged, stdin=stdin,
                                                       stdout=stdout, stderr=stderr, start_new_session=True),
        columns=columns, lines=40, timeout=timeout)
    return status, shown(raw)


def shell_argv(tmp_path, body: str, shell: str = "bash") -> list:
    """The argv `python` gets when `shell` (bash, zsh) runs `body` (quotes, escapes and line continuations applied)."""
    import os
    import subprocess
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "python"
    fake.write_text('#!/bin/bash\nprintf "%s\\0" "$@" > "$ARGV_FILE"\n')
    fake.chmod(0o755)
    argv_file = tmp_path / "argv"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "ARGV_FILE": str(argv_file)}
    result = subprocess.run([shell, "-c", body], env=env, capture_output=True, text=True, timeout=600)  # a hang detector only
    assert result.returncode == 0, result.stderr
    return argv_file.read_text().split("\0")[:-1]


def prompted_lines(body: str) -> List[tuple]:
    """(command, the output lines the page shows under it) of each ``$ `` line of a block's body."""
    found: List[tuple] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            found.append((line[2:], []))
        elif found:
            found[-1][1].append(line)
    return found


def shown_under(line: DocLine) -> List[str]:
    """The output lines the page shows under `line` (a ``$ `` line), up to the end of its block."""
    text = (ROOT / line.page).read_text(encoding="utf-8")
    return text.split(f"$ {line.text}\n", 1)[1].split("```", 1)[0].rstrip("\n").splitlines()


# A time of day changes from run to run: on both sides, each is read as "some time".
_TIME = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d(:\d\d)?")


def matches(expected: str, got: str) -> bool:
    """Whether an output line is the one the page shows: runs of blanks count as one (table widths), a
    date and time stands for any, and ``…`` for any text (a host, a cell cut to its column)."""
    expected, got = _TIME.sub("<time>", expected), _TIME.sub("<time>", got)
    pattern = ".*?".join(re.escape(" ".join(part.split())) for part in expected.split("…"))
    return re.fullmatch(pattern, " ".join(got.split())) is not None
