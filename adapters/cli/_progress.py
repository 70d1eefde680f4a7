"""Progress bars on stderr, drawn only on a terminal and never with ``--json`` (docs/sharing.md, "Progress").

Three shapes share one rule set:

- `progress_bar`: a plain bar of items done of all (timeline, import-verl);
- `progress_to`: the library's ``progress(what, done, total, moved)`` callback of push, pull, clone,
  export and import: one bar per kind of item, with the bytes moved and their rate;
- `bytes_checked`: `Journal.verify`'s ``progress(done, total)`` callback, counted in bytes.

The two callbacks start their bar at the first report, so a verb that fails before it reports anything
prints its one error line and nothing else, and they give the rate over the whole verb (remote round
trips included), which is what the user waits for.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Dict, Iterator, Optional

from rich.console import Console

from ._render import human_size

__all__ = ["progress_bar", "progress_to", "bytes_checked"]


class _NoBar:
    """What `progress_bar` gives when nothing is drawn (a pipe, a file, ``--json``): the calls a bar takes, doing
    nothing, and no rich bar made."""

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *_exc: Any) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def add_task(self, *_args: Any, **_fields: Any) -> int:
        return 0

    def update(self, *_args: Any, **_fields: Any) -> None:
        pass


def progress_bar(err: Console, *, quiet: bool = False, moved: bool = False, in_bytes: bool = False) -> Any:
    """A rich progress bar on `err` (use as a context manager): drawn only when `err` is a terminal and
    not `quiet` (a ``--json`` run), so a log file or a pipe gets no bar. `moved`: a column for each task's
    ``moved`` field (the bytes moved and their rate, as `progress_to` fills it). `in_bytes`: the counts
    are bytes, shown as sizes, with a ``rate`` field."""
    if quiet or not err.is_terminal:
        return _NoBar()
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn)

    columns = [TextColumn("{task.description}"), BarColumn()]
    columns.append(DownloadColumn() if in_bytes else MofNCompleteColumn())
    if moved:
        columns.append(TextColumn("{task.fields[moved]}"))
    if in_bytes:
        columns.append(TextColumn("{task.fields[rate]}"))
    return Progress(
        *columns,
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
    )


class _OnFirstReport:
    """A bar made and started at the first report, with the rate of bytes over the whole verb."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._began = time.monotonic()
        self._bar: Optional[Any] = None

    def bar(self) -> Any:
        if self._bar is None:
            self._bar = self._make()
            self._bar.start()
        return self._bar

    def rate(self, nbytes: int) -> str:
        return f"{human_size(int(nbytes / max(time.monotonic() - self._began, 1e-6)))}/s"

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()


@contextlib.contextmanager
def progress_to(err: Console, *, quiet: bool = False) -> Iterator[Callable[..., None]]:
    """A library progress callback drawn on `err`: per kind of item, those done of all, the bytes moved
    so far and their rate (it `counts_bytes`), and the time left."""
    shown = _OnFirstReport(lambda: progress_bar(err, quiet=quiet, moved=True))
    tasks: Dict[str, Any] = {}

    def update(what: str, done: int, total: int, moved: int = 0) -> None:
        bar = shown.bar()
        if what not in tasks:
            tasks[what] = bar.add_task(what, total=total or None, moved="")
        rate = f" · {shown.rate(moved)}" if moved else ""
        bar.update(tasks[what], completed=done, total=total or None, moved=f"{human_size(moved)}{rate}")

    update.counts_bytes = True  # type: ignore[attr-defined]
    try:
        yield update
    finally:
        shown.stop()


@contextlib.contextmanager
def bytes_checked(err: Console, *, quiet: bool = False) -> Iterator[Callable[[int, int], None]]:
    """`Journal.verify`'s progress callback drawn on `err`: the bytes checked of all, their rate, and the
    time left."""
    shown = _OnFirstReport(lambda: progress_bar(err, quiet=quiet, in_bytes=True))
    task: Dict[str, Any] = {}

    def update(done: int, total: int) -> None:
        bar = shown.bar()
        if not task:
            task["id"] = bar.add_task("verifying", total=total, rate="")
        bar.update(task["id"], completed=done, total=total, rate=shown.rate(done))

    try:
        yield update
    finally:
        shown.stop()
