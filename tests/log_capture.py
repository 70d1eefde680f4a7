"""`captured_events`: the library's log events, as the dicts its stdlib log records carry."""

from __future__ import annotations

import contextlib
import logging
from typing import Dict, Iterator, List


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.events: List[Dict] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(dict(getattr(record, "stepjournal", {"event": record.getMessage()})))


@contextlib.contextmanager
def captured_events(level: int = logging.DEBUG) -> Iterator[List[Dict]]:
    """Collect every event of the ``stepjournal`` logger at `level` and above while inside."""
    logger = logging.getLogger("stepjournal")
    handler, saved = _Collect(), logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield handler.events
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved)
