"""The command line's output: consoles, tables, progress, JSON, one-line errors, shared cell text.

Rich's tables, trees and progress bars are imported by the verbs that draw them, so that
``stepjournal --help`` loads none of them.

Everything a journal holds is somebody else's text: a run key, a reason, a host name may carry
terminal escape sequences. `clean` is the one gate every such value passes before it reaches a
table, a CSV cell or an error line; JSON is escaped by `json` itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from typing import Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from rich.cells import cell_len
from rich.console import Console
from rich.markup import escape

from stepjournal.sharing import redact
from stepjournal.errors import DiffError, JournalError
from stepjournal.tools import JSON_RAW, SURROGATE, iso_time  # the audit rows' escapes, one definition
from stepjournal.vocabulary import ACTION_COLOURS

__all__ = [
    "UsageError",
    "Failure",
    "clean",
    "cell",
    "int_text",
    "ACTION_STYLE",
    "consoles",
    "make_console",
    "print_line",
    "one_line",
    "print_json",
    "fingerprint_text",
    "short_time",
    "safe_iso_time",
    "json_text",
    "human_size",
    "error_line",
    "FittedColumns",
    "print_unsqueezed",
    "terminal_width",
    "NO_TERMINAL_WIDTH",
    "plain_table",
    "JSON_RAW",
    "SURROGATE",
    "Column",
]

# rich's style of each action: the vocabulary's one colour map.
ACTION_STYLE = ACTION_COLOURS


class UsageError(Exception):
    """Bad arguments: exit status 2."""


class Failure(Exception):
    """The command could not do its work: exit status 1."""


class _Console(Console):
    """A rich console that lets a closed pipe reach `main` (which exits quietly) instead of exiting 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(32, "Broken pipe")


def make_console(**options: Any) -> Console:
    return _Console(highlight=False, **options)


def print_line(console: Console, text: str, **options: Any) -> None:
    """Print `text` (rich markup) as one line that the terminal wraps, not rich: a path in it stays one
    piece to copy (rich breaks a long line at the width, inside a path too) and a pipe gets it whole; `options`
    go to `Console.print` (``markup=False`` for text that is not markup).
    Every line of a verb that names a path or a URL goes through here."""
    console.print(text, soft_wrap=True, **options)


class _TrimmedLines:
    """A text stream for a pipe or a file: each line reaches it without the spaces that pad a table
    to its width. Text after the last newline waits for the rest of its line (or for `finish`)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._pending = ""
        self.encoding = getattr(stream, "encoding", None) or "utf-8"

    def write(self, text: str) -> int:
        lines, sep, self._pending = (self._pending + text).rpartition("\n")
        if sep:
            self._stream.write("\n".join(line.rstrip(" ") for line in lines.split("\n")) + "\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def finish(self) -> None:
        """Write what waits for the end of its line."""
        if self._pending:
            self._stream.write(self._pending)
            self._pending = ""
        self._stream.flush()

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._stream.fileno()


# The most a table takes when no terminal is in sight and COLUMNS is not set (a file, cron, CI, a script's
# capture): a table is as wide as its cells need, so this only bounds a long reason, and keeps it whole for grep.
NO_TERMINAL_WIDTH = 200


def terminal_width() -> Optional[int]:
    """The width output is drawn at when stdout is no terminal: COLUMNS when set, else the width of a
    terminal on stderr or stdin (the one a pipe's reader shows), else None.

    The controlling terminal (/dev/tty) is not asked: a process whose three streams are redirected (a test
    run, a job started from a shell) keeps the fixed width whatever window started it."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    for fd in (2, 0):
        try:
            found = os.get_terminal_size(fd).columns
        except (OSError, ValueError):
            continue
        if found > 0:
            return found
    return None


@contextlib.contextmanager
def consoles() -> Iterator[Tuple[Console, Console]]:
    """The console for results (stdout) and the one for progress and warnings (stderr)."""
    for stream in (sys.stdout, sys.stderr):
        # A terminal or pipe that cannot take some character (LANG=C, a lone surrogate) gets an escape.
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    out = make_console()
    if out.is_terminal:
        yield out, make_console(stderr=True)
        return
    # A pipe gets the width of the terminal it ends in (`stepjournal runs J | head`: stderr or stdin is that
    # terminal), or COLUMNS; with neither, tables take up to NO_TERMINAL_WIDTH and a line of text stays one
    # line (scripts grep it). No line carries the padding of a table.
    trimmed = _TrimmedLines(sys.stdout)
    width = terminal_width()
    out = make_console(file=trimmed, width=width or NO_TERMINAL_WIDTH, soft_wrap=width is None)
    try:
        yield out, make_console(stderr=True)
    finally:
        trimmed.finish()


# C0 and C1 controls, DEL, lone surrogates, and the bidirectional overrides and isolates that
# reorder what a terminal shows ("Trojan Source").
# the two noncharacters too: no XML text (an SVG) may hold them
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff\u202a-\u202e\u2066-\u2069\ufffe\uffff]")
_MAX_INT_DIGITS = 4000


def _escape_char(match: "re.Match[str]") -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: object) -> str:
    """`text` as a string that is safe to print: control characters, lone surrogates and bidi
    overrides become visible ``\\x1b`` / ``\\udc80`` escapes; nothing reaches the terminal raw."""
    return _UNSAFE.sub(_escape_char, text if isinstance(text, str) else str(text))


def cell(text: object) -> str:
    """`clean` text made literal for rich markup (a table cell, a line printed through a console)."""
    return escape(clean(text))


def int_text(value: int) -> str:
    """An int as digits, or "int of N digits" when it is too long to show (or for Python to convert)."""
    if -(10 ** 18) < value < 10 ** 18:
        return str(value)
    digits = int(value.bit_length() * 0.30103) + 1  # within one of the true count; no conversion
    if digits > _MAX_INT_DIGITS:
        return f"{'-' if value < 0 else ''}int of about {digits} digits"
    return str(value)


def one_line(message: object) -> str:
    """A message on one line, made safe to print (`clean`) and without secrets (`stepjournal.sharing.redact`)."""
    return clean(redact(" ".join(line.strip() for line in str(message).splitlines() if line.strip())))


# The library's arguments as this program names them (a message names the ones it is about in its
# typed parts, `JournalError.words`): a path is the folder itself, a read is a reading command.
_ARGUMENT_WORDS = {
    "path": lambda value: str(value),
    "readonly": lambda value: "a command that only reads (runs, audit, show, verify, diff)",
}


def _argument_words(name: str, value: Any) -> str:
    worded = _ARGUMENT_WORDS.get(name)
    if worded is not None:
        return worded(value)
    return flag_of(name) if value is None or value is True else f"{flag_of(name)} {JournalError.shown(value)}"


def flag_of(argument: str) -> str:
    """A keyword argument of the library (``run_a``) as this program's flag (``--run-a``)."""
    return "--" + argument.replace("_", "-")


def error_line(exc: object) -> str:
    """An error as the command line prints it: `one_line`, in the command line's words, from the error's
    typed fields (``--run-a`` from a `DiffError`'s `argument`; a folder, not ``path='folder'``, and a reading
    command, not ``readonly=True``, from a `JournalError`'s `parts`)."""
    if isinstance(exc, DiffError) and exc.argument is not None:
        exc = f"{exc.reason}; choose one with {flag_of(exc.argument)}"
    elif isinstance(exc, JournalError):
        exc = exc.start + exc.words(_argument_words)
    return one_line(exc)


def json_text(value: Any) -> str:
    """`value` as exact JSON (no NaN, no infinity): ints of any length; lone surrogates, C1 controls and bidi
    overrides as \\u escapes (JSON escapes C0 controls itself), so the text is safe on a terminal too."""
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # a journal may hold an int of 20 000 digits; JSON keeps it exact
    try:
        text = json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False)
        if SURROGATE.search(text):  # not encodable as UTF-8; JSON spells it as an escape
            text = json.dumps(value, indent=2, ensure_ascii=True, allow_nan=False)
        # Only strings hold these characters, so their \u escapes are the same JSON of the same text.
        text = JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    finally:
        sys.set_int_max_str_digits(old)
    return text


def print_json(value: Any) -> None:
    sys.stdout.write(json_text(value) + "\n")


def human_size(nbytes: int) -> str:
    from rich.filesize import decimal

    return decimal(nbytes)


def fingerprint_text(fp: Dict[str, Any]) -> str:
    """A fingerprint as ``k=v, ...``, ready for rich markup."""
    if not fp:
        return "{}"
    return cell(", ".join(f"{k}={v if isinstance(v, str) else _json_or_text(v)}" for k, v in sorted(fp.items())))


def _json_or_text(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def safe_iso_time(ts: Optional[float]) -> Optional[str]:
    """`iso_time`, or None for a time no calendar holds (1e300, NaN: a damaged or crafted event)."""
    try:
        return iso_time(ts)
    except (OverflowError, ValueError, OSError, TypeError):
        return None


def short_time(ts: Optional[float]) -> str:
    text = safe_iso_time(ts)
    if text is None:
        return "-" if ts is None else "?"
    return text.replace("T", " ")[:19]


# A column of a table that fits the terminal: name, justify, and the most it takes (None: the free-text column,
# which gets what the others leave).
Column = Tuple[str, str, Optional[int]]
_FREE_MIN = 8  # a free-text column narrower than this says nothing


def plain_table() -> Any:
    """The command line's table: a rule under the header, no frame, two spaces between columns (one of
    padding after each cell and the box's one-space divider)."""
    from rich import box
    from rich.table import Table

    return Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0))


class FittedColumns:
    """The widths of a table of one line per row that fits `width` columns.

    Every column takes what its header and cells need when the table fits so. Else a fixed column takes that
    up to its most, and the free-text columns (most None: a reason, a fingerprint) share what is left, no more
    than they need. They get 3/8 of the width at least (or what they need, when less): for that the widest
    fixed columns give way, down to their header's width, except those named `whole` (a step, an action:
    never cut); what the free text does not need goes back to the fixed columns cut. Rows come in pieces
    (`measure` each before `table`): a column only grows, so the pieces of a long listing line up unless a
    later cell needs more.
    """

    def __init__(self, width: int, columns: Sequence[Column], *, whole: Sequence[str] = ()) -> None:
        self.width = width
        self.columns = list(columns)
        self.whole = set(whole)
        self.needs = [cell_len(name) for name, _, _ in columns]  # what each column's cells need, however wide

    def measure(self, rows: Iterable[Sequence[str]]) -> None:
        """Grow the columns to what `rows` (plain text, one string a column) need."""
        for row in rows:
            for i, text in enumerate(row):
                self.needs[i] = max(self.needs[i], cell_len(text))

    def widths(self) -> List[int]:
        """Each column's width."""
        # A column is its text, a space of padding and a space of divider; the last has neither (pad_edge).
        if sum(need + 2 for need in self.needs) - 2 <= self.width:
            return list(self.needs)
        fixed = {i: min(need, most) for i, (need, (_, _, most)) in enumerate(zip(self.needs, self.columns))
                 if most is not None}
        least = {i: w if self.columns[i][0] in self.whole else min(w, max(3, cell_len(self.columns[i][0])))
                 for i, w in fixed.items()}
        free = len(self.columns) - len(fixed)

        def share() -> int:
            return (self.width + 2 - sum(w + 2 for w in fixed.values())) // max(free, 1) - 2

        wanted = max((need for i, need in enumerate(self.needs) if i not in fixed), default=0)
        floor = min(max(_FREE_MIN, self.width * 3 // 8), wanted)  # never more than the free text needs
        while free and share() < floor:
            shrinking = [i for i in fixed if fixed[i] > least[i]]
            if not shrinking:
                break
            fixed[max(shrinking, key=lambda i: fixed[i])] -= 1
        # Narrower still (a 40-column terminal): the headers of the columns that may be cut give way too, for
        # a free column of _FREE_MIN (or what it needs); a line wider than the terminal is cut by the table
        # itself, anywhere, the step and the action included.
        while free and share() < min(_FREE_MIN, wanted):
            shrinking = [i for i in fixed if fixed[i] > 1 and self.columns[i][0] not in self.whole]
            if not shrinking:
                break
            fixed[max(shrinking, key=lambda i: fixed[i])] -= 1
        rest = max(1, share())
        widths = [fixed[i] if i in fixed else min(need, rest) for i, need in enumerate(self.needs)]
        spare = self.width - (sum(w + 2 for w in widths) - 2)  # what the free text does not need goes back
        for i in fixed:
            grown = max(0, min(spare, self.needs[i] - widths[i]))
            widths[i] += grown
            spare -= grown
        return widths

    def table(self, *, wrap: bool = False) -> Any:
        """An empty table of these widths: each cell cut to its column's width with an ellipsis, or with
        `wrap`, a free column's text wrapped onto more lines."""
        table = plain_table()
        for (name, justify, most), w in zip(self.columns, self.widths()):
            wraps = wrap and most is None
            table.add_column(name, justify=justify, width=w, no_wrap=not wraps,
                             overflow="fold" if wraps else "ellipsis")
        return table


def print_unsqueezed(out: Console, table: Any) -> None:
    """`table` at its own width, however narrow the terminal: a long line overflows (for ``less -S``, a pipe,
    a file) instead of wrapping or losing its end. Each column gets its widest cell (``--wide``)."""
    from rich.measure import Measurement
    from rich.segment import Segments

    for column in table.columns:
        column.no_wrap = True  # at its own width nothing is cut: each column gets its widest cell
    natural = Measurement.get(out, out.options.update_width(1 << 16), table).maximum
    # Console.print draws at most the console's width: the table is drawn at its own, then printed uncropped.
    out.print(Segments(out.render(table, out.options.update_width(natural))), crop=False)
