"""How push, pull, clone and bundles report progress: one callback type, and the opt-in for bytes.

A callback is called ``progress(what, done, total)``: ``what`` names the work (``"push"``, ``"pull 1a2b3c4d"``,
``"bundle"``), ``done`` and ``total`` count its events (``total`` 0: not known). A callback whose
``counts_bytes`` attribute is true is called ``progress(what, done, total, moved)`` instead, ``moved`` being the
bytes sent, fetched or written so far: what a display turns into a size and a rate (the command line's bars).
`export_payloads` reports ``progress(done, total)`` (calls written), and ``progress(done, total, moved)`` to such
a callback. One whose ``counts_total_bytes`` attribute is true too is called
``progress(what, done, total, moved, moved_total)``, ``moved_total`` being all the bytes the work moves when
it knows them (a push: the payloads it sends and its segments so far; a pull and a clone: the payloads it
fetches; 0: not known), so a display shows "of" and the
time left by bytes.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

__all__ = ["Progress", "report_progress"]

Progress = Optional[Callable[..., None]]


def report_progress(progress: Progress, *counts: Any, moved: int, moved_total: int = 0) -> None:
    """Tell `progress` (None: nobody) how far the work got (`counts`: ``what, done, total``, or ``done, total``
    for `export_payloads`), with the bytes `moved` last to a callback that `counts_bytes`, and of all
    `moved_total` (0: not known) after them to one that `counts_total_bytes` too."""
    if progress is None:
        return
    if getattr(progress, "counts_bytes", False) and getattr(progress, "counts_total_bytes", False):
        progress(*counts, moved, moved_total)
    elif getattr(progress, "counts_bytes", False):
        progress(*counts, moved)
    else:
        progress(*counts)
