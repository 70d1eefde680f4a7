"""The one pseudo-terminal runner of the tests: a command with a terminal as its stdin, stdout and stderr (or its
stdout a pipe), read until every holder of the terminal has closed it, and what a terminal shows of its bytes.

The CLI's terminal tests start ``stepjournal`` through `cli_support.start_cli`, the docs' lines start bash
(`doc_lines.typed_in_terminal`); both hand `on_a_terminal` a ``start(stdin, stdout, stderr)``.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import termios
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

ESCAPES = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


def terminal_env(env: Optional[Mapping[str, Optional[str]]] = None) -> Dict[str, str]:
    """This process's environment as a terminal's: no COLUMNS or LINES (the window's size says the width),
    TERM=xterm, PAGER=cat (a pager shows the page and ends); then `env` (a None value removes the name)."""
    merged = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    merged.update(TERM="xterm", PAGER="cat")
    for key, value in (env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def on_a_terminal(start: Callable[[int, int, int], Any], *, columns: Optional[int] = None, lines: int = 50,
                  pipe: bool = False, timeout: float = 900) -> Tuple[int, bytes]:
    """Start a command with ``start(stdin, stdout, stderr)``: the follower of a new pseudo-terminal for all three
    (stdout a pipe with `pipe`), its window `columns` wide when given, as a terminal sets it. Read what it writes
    to stdout until every holder has closed it; return (exit status, the bytes). `start` returns a handle with
    ``wait(timeout)``, as `subprocess.Popen` has."""
    leader, follower = pty.openpty()
    if columns is not None:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
    out_r, out_w = os.pipe() if pipe else (None, follower)
    try:
        proc = start(follower, out_w, follower)
    finally:
        os.close(follower)
        if out_w != follower:
            os.close(out_w)
    source = leader if out_r is None else out_r
    chunks = []
    deadline = time.monotonic() + timeout  # a hang detector only
    while time.monotonic() < deadline:
        ready, _, _ = select.select([source], [], [], 0.5)
        if not ready:
            continue
        try:
            data = os.read(source, 65536)
        except OSError:  # EIO: every holder of the terminal's other side has closed it
            break
        if not data:
            break
        chunks.append(data)
    status = proc.wait(60)
    os.close(leader)
    if out_r is not None:
        os.close(out_r)
    return status, b"".join(chunks)


def shown(raw: bytes) -> str:
    """What a terminal shows of `raw`: no colours or title escapes, no trailing spaces (a table's padding), and
    none of the lines a carriage return redraws (a progress bar)."""
    text = ESCAPES.sub("", raw.decode("utf-8", "replace")).replace("\r\n", "\n")
    return "\n".join(line.rstrip(" ") for line in text.split("\n") if "\r" not in line)
