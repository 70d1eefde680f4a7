"""The library's loggers: structlog key-value events, handed to the standard `logging` hierarchy.

Every module logs through ``get_logger(__name__)``: a structlog logger bound to the stdlib logger of
that name (``stepjournal._journal``, ``stepjournal.adapters.trl`` ...), so everything sits under the
``stepjournal`` logger. Nothing here configures structlog globally: an application that configures
nothing sees only warnings and errors, on stderr, each line prefixed ``stepjournal: warning:`` (the
``stepjournal`` logger's one handler, `_Unconfigured`, stands in for the standard library's last resort,
which would print the bare event, and steps aside as soon as the application adds a handler of its own),
and ``logging.getLogger("stepjournal").setLevel(...)`` works as for any library.

A record's message is ``event key=value ...``; the fields also travel as the record's ``stepjournal``
attribute (a dict with ``event``), for JSON formatters and structlog's ``ProcessorFormatter``. Both
pass `redact` (docs/sharing.md, "Secrets").
"""

from __future__ import annotations

import contextlib
import logging
import sys
from types import FrameType
from typing import Any, Dict, Iterator, MutableMapping, Optional, TextIO, Tuple

from ._secrets import redact

__all__ = ["LOGGER_NAME", "RECORD_ATTRIBUTE", "get_logger", "console_logging", "warn"]

LOGGER_NAME = "stepjournal"
RECORD_ATTRIBUTE = "stepjournal"


def _to_stdlib(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> Tuple[Tuple[str], Dict[str, Any]]:
    # Every record passes `redact` here, at the one door out: no URL's user info, no credential value.
    fields = {key: redact(value) if isinstance(value, str) else value for key, value in event_dict.items()}
    event = str(fields.pop("event", ""))
    text = redact(" ".join([event, *(f"{key}={value!r}" for key, value in fields.items())]))
    return (text,), {"extra": {RECORD_ATTRIBUTE: {"event": event, **fields}}}


def _wrap(stdlib: logging.Logger) -> Any:
    import structlog  # here, not at import: structlog's package imports rich (a third of the CLI's start)

    return structlog.wrap_logger(
        stdlib,
        processors=[structlog.stdlib.filter_by_level, _to_stdlib],
        wrapper_class=structlog.stdlib.BoundLogger,
    )


class _Logger:
    """What `get_logger` returns: ``debug`` / ``info`` / ``warning`` / ``error`` take an event and its
    key-value fields, as structlog's loggers do.

    The structlog logger behind it is built at the first event its level lets through, so importing
    the library (and ``stepjournal --help``) does not import structlog, and a disabled event costs
    one ``isEnabledFor``. Anything else (``bind`` ...) is the structlog logger's.
    """

    __slots__ = ("_stdlib", "_bound")

    def __init__(self, stdlib: logging.Logger) -> None:
        self._stdlib = stdlib
        self._bound: Any = None

    def _structlog(self) -> Any:
        if self._bound is None:
            self._bound = _wrap(self._stdlib)
        return self._bound

    def _emit(self, level: int, method: str, event: str, fields: Dict[str, Any]) -> None:
        if self._stdlib.isEnabledFor(level):
            getattr(self._structlog(), method)(event, **fields)

    def debug(self, event: str, **fields: Any) -> None:
        self._emit(logging.DEBUG, "debug", event, fields)

    def info(self, event: str, **fields: Any) -> None:
        self._emit(logging.INFO, "info", event, fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._emit(logging.WARNING, "warning", event, fields)

    def error(self, event: str, **fields: Any) -> None:
        self._emit(logging.ERROR, "error", event, fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._structlog(), name)


class _Unconfigured(logging.Handler):
    """The library's warnings while the application configured no logging: what the standard library's last
    resort would print (warnings and errors, on stderr), with the ``stepjournal:`` prefix a reader can tell
    them by. Any handler the application has on the record's way up (the root's, ``basicConfig``'s,
    `console_logging`'s) makes it print nothing; so does ``logging.lastResort = None``."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        if logging.lastResort is None or self._handled_elsewhere(logging.getLogger(record.name)):
            return
        try:
            sys.stderr.write(f"{LOGGER_NAME}: {record.levelname.lower()}: {record.getMessage()}\n")
        except Exception:  # as logging's own handlers: a broken stderr never breaks the caller
            self.handleError(record)

    def _handled_elsewhere(self, logger: Optional[logging.Logger]) -> bool:
        while logger is not None:
            if any(handler is not self for handler in logger.handlers):
                return True
            if not logger.propagate:
                return False
            logger = logger.parent
        return False


def _install_last_resort() -> None:
    logger = logging.getLogger(LOGGER_NAME)
    if not any(isinstance(handler, _Unconfigured) for handler in logger.handlers):
        logger.addHandler(_Unconfigured())


_install_last_resort()


def _ours(module: str) -> bool:
    return module == LOGGER_NAME or module.startswith(LOGGER_NAME + ".")


def warn(message: str, category: type) -> None:
    """Issue a Python warning of `category` pointing at the first line outside stepjournal (the user's own
    call), however deep in the library it was found; stacklevel counted by module name, so it holds in an
    editable install and a wheel alike (``skip_file_prefixes`` needs Python 3.12 and the files' folders)."""
    import warnings

    frame: Optional[FrameType] = sys._getframe(1)
    level = 2
    while frame is not None and _ours(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)


def get_logger(name: str) -> Any:
    """A logger of key-value events writing to the stdlib logger `name` (which must sit under ``stepjournal``)."""
    if name != LOGGER_NAME and not name.startswith(LOGGER_NAME + "."):
        raise ValueError(f"logger {name!r} is not under {LOGGER_NAME!r}")
    return _Logger(logging.getLogger(name))


@contextlib.contextmanager
def console_logging(level: int, stream: Optional[TextIO] = None) -> Iterator[None]:
    """While inside, print the library's events at `level` and above to `stream` (stderr by default).

    For the command line and the demo, which own their output; a library caller configures `logging`
    itself. The logger's previous level, handlers and propagation are restored on exit.
    """
    logger = logging.getLogger(LOGGER_NAME)
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(logging.Formatter("stepjournal: %(levelname)s %(message)s"))
    saved = (logger.level, logger.propagate)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
