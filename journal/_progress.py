"""How push, pull, clone and bundles report progress: one callback type, and the opt-in for bytes.

A callback is called ``progress(what, done, total)``: ``what`` names the work (``"push"``, ``"pull 1a2b3c4d"``,
``"bundle"``), ``done`` and ``total`` count its events (``total`` 0: not known). A callback whose
``counts_bytes`` attribute is true is called ``progress(what, done, total, moved)`` instead, ``moved`` being the
bytes sent, fetched or written so far: what a display turns into a size and a rate (the command line's bars).
"""

from __future__ import annotations

from typing import Callable, Optional

__all__ = ["Progress", "report_progress"]

Progress = Optional[Callable[..., None]]


def report_progress(progress: Progress, what: str, done: int, total: int, moved: int) -> None:
    """Tell `progress` (None: nobody) how far `what` got: `moved` only to a callback that `counts_bytes`."""
    if progress is None:
        return
    if getattr(progress, "counts_bytes", False):
        progress(what, done, total, moved)
    else:
        progress(what, done, total)
