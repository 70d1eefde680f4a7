"""stepjournal's logging, for what is built on it (its adapters, codec and policy plugins, your own tools).

- ``get_logger(__name__)``: a structlog logger handed to the standard `logging` hierarchy, under the
  ``stepjournal`` logger (`LOGGER_NAME`), every record redacted (no credential reaches a log line);
  nothing is configured globally and no handler is added.
- ``console_logging(level)``: a context that shows the records of `level` and above on stderr, as the
  command line's ``-v`` does.
- ``warn(message, category)``: a Python warning pointing at the user's line (the first outside stepjournal).

Unconfigured, the library's warnings reach stderr as ``stepjournal: warning: event key=value ...``.

A record's fields travel as its `RECORD_ATTRIBUTE` attribute (docs/journal.md, "Logging"). This module is
the public face of ``stepjournal.base._log``, the core's own.
"""

from __future__ import annotations

from .base._log import LOGGER_NAME, RECORD_ATTRIBUTE, console_logging, get_logger, warn

__all__ = ["LOGGER_NAME", "RECORD_ATTRIBUTE", "get_logger", "console_logging", "warn"]
