"""A pager for long tables on a terminal, as ``git log`` does: ``$PAGER``, else ``less -FRX``.

Never when stdout is not a terminal, never with ``--no-pager`` or ``PAGER=cat``/empty. The pager
reads as the table is printed, so the first screen shows before the whole journal is read;
``less -F`` quits at once when everything fits on one screen.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
from typing import Iterator, List, Optional

from rich.console import Console

from ._render import make_console

__all__ = ["paged"]


def _pager_command() -> Optional[List[str]]:
    text = os.environ.get("STEPJOURNAL_PAGER", os.environ.get("PAGER"))
    if text is None:
        return ["less", "-FRX"] if shutil.which("less") else None
    try:
        words = shlex.split(text)
    except ValueError:
        return None
    if not words or words == ["cat"] or shutil.which(words[0]) is None:
        return None
    return words


@contextlib.contextmanager
def paged(out: Console, *, enabled: bool = True) -> Iterator[Console]:
    """A console that writes through the pager when `out` is a terminal (else `out` itself)."""
    command = _pager_command() if enabled and out.is_terminal else None
    if command is None:
        yield out
        return
    env = dict(os.environ)
    env.setdefault("LESS", "FRX")
    try:
        pager = subprocess.Popen(command, stdin=subprocess.PIPE, env=env, text=True, encoding="utf-8",
                                 errors="backslashreplace")
    except OSError:
        yield out
        return
    assert pager.stdin is not None  # stdin=PIPE: Popen made the pipe
    console = make_console(file=pager.stdin, force_terminal=True, width=out.width, color_system=out.color_system)
    try:
        yield console
    except BrokenPipeError:
        pass  # the user quit the pager before the end: that is not an error
    finally:
        with contextlib.suppress(BrokenPipeError, OSError):
            pager.stdin.close()
        pager.wait()
