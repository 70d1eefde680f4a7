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
from typing import Any, Callable, Dict, Iterator, List, Optional

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


def _clock(seconds: Optional[float]) -> str:
    """``H:MM:SS`` (``-:--:--`` when not known), as rich's time columns write it."""
    if seconds is None or seconds != seconds or seconds < 0:
        return "-:--:--"
    whole = int(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def _time_columns() -> List[Any]:
    """The two time columns, each labelled: ``elapsed 0:00:03`` and ``left 0:00:10`` (rich's own columns
    print two bare clocks, which reads as a range)."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    from rich.table import Column

    class Elapsed(ProgressColumn):
        def render(self, task: Any) -> Text:
            return Text(f"elapsed {_clock(task.finished_time if task.finished else task.elapsed)}",
                        style="progress.elapsed")

    class Left(ProgressColumn):
        def render(self, task: Any) -> Text:
            left = task.fields.get("left")  # the verb's own estimate (by bytes), else rich's (by the counts)
            left = task.time_remaining if left is None else left
            return Text(f"left {_clock(0 if task.finished else left)}", style="progress.remaining")

    return [Elapsed(table_column=Column(no_wrap=True)), Left(table_column=Column(no_wrap=True))]


def progress_bar(err: Console, *, quiet: bool = False, moved: bool = False, in_bytes: bool = False) -> Any:
    """A rich progress bar on `err` (use as a context manager): drawn only when `err` is a terminal and
    not `quiet` (a ``--json`` run), so a log file or a pipe gets no bar. `moved`: columns for each task's
    ``events`` and ``moved`` fields (the events done of all, the bytes moved of all and their rate, as
    `progress_to` fills them) and its ``left`` field (the time left). `in_bytes`: the counts are bytes,
    shown as sizes, with a ``rate`` field. The times are labelled: ``elapsed 0:00:03 left 0:00:10``."""
    if quiet or not err.is_terminal:
        return _NoBar()
    from rich.progress import BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn

    from rich.table import Column

    def text(template: str) -> Any:
        return TextColumn(template, table_column=Column(no_wrap=True))

    # Under 100 columns the bar takes what the words leave (at 80: a few cells): the words never wrap.
    wide = err.width >= 100
    bar = BarColumn(bar_width=40) if wide else BarColumn(bar_width=None, table_column=Column(ratio=1))
    columns = [text("{task.description}"), bar]
    if moved:
        columns += [text("{task.fields[events]}"), text("{task.fields[moved]}")]
    else:
        columns.append(DownloadColumn() if in_bytes else MofNCompleteColumn())
    if in_bytes:
        columns.append(text("{task.fields[rate]}"))
    return Progress(*columns, *_time_columns(), console=err, expand=not wide)


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

    def per_second(self, nbytes: int) -> float:
        return nbytes / max(time.monotonic() - self._began, 1e-6)

    def rate(self, nbytes: int) -> str:
        return f"{human_size(int(self.per_second(nbytes)))}/s"

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _of(moved: int, total: int) -> str:
    """``12.3/98.8 MB``: the bytes moved of all, in the unit of all (as rich's download column writes them)."""
    from rich.filesize import pick_unit_and_suffix

    unit, suffix = pick_unit_and_suffix(total, ["bytes", "kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"], 1000)
    places = 0 if unit == 1 else 1
    return f"{moved / unit:,.{places}f}/{total / unit:,.{places}f} {suffix}"


@contextlib.contextmanager
def progress_to(err: Console, *, quiet: bool = False, again: str = "") -> Iterator[Callable[..., None]]:
    """A library progress callback drawn on `err`: per kind of item, those done of all, the bytes moved
    so far of all to move (it `counts_bytes` and `counts_total_bytes`) and their rate, the time elapsed and
    the time left. Interrupted (Ctrl-C), it stops the bar and re-raises the `KeyboardInterrupt` saying
    that what was done is kept and that running `again` (the command line that resumes) resumes it."""
    shown = _OnFirstReport(lambda: progress_bar(err, quiet=quiet, moved=True))
    tasks: Dict[str, Any] = {}

    def update(what: str, done: int, total: int, moved: int = 0, moved_total: int = 0) -> None:
        bar = shown.bar()
        if what not in tasks:
            tasks[what] = bar.add_task(what, total=None, events="", moved="", left=None)
        # The bar and the time left go by bytes when the verb knows how many it moves, else by events.
        whole, part = (moved_total, moved) if moved_total else (total, done)
        rate = shown.per_second(moved) if moved_total else 0.0
        left: Optional[float] = (moved_total - moved) / rate if rate else None
        size = _of(moved, moved_total) if moved_total else human_size(moved)
        speed = f" {shown.rate(moved)}" if moved else ""
        events = f"{done}/{total}{' events' if err.width >= 100 else ''}"  # at 80 columns the line fits whole
        bar.update(tasks[what], completed=part, total=whole or None, events=events, moved=f"{size}{speed}",
                   left=left)

    update.counts_bytes = True  # type: ignore[attr-defined]
    update.counts_total_bytes = True  # type: ignore[attr-defined]
    try:
        yield update
    except KeyboardInterrupt:
        shown.stop()
        raise KeyboardInterrupt(f"what was done is kept; running {again or 'the same command'} again resumes "
                                "it") from None
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
