"""Workers for tests/integration/test_never_lose_work.py, importable by `spawn` children."""

from __future__ import annotations

import logging
import os
import socket


def record_and_hold(path: str, run: str, recorded, release, answers) -> None:
    """Record step 1 of `run`, say who recorded it, and keep the session open until `release` is set."""
    from stepjournal import Journal

    with Journal(path, run=run) as journal:
        journal.record(1, {"who": "first"})
        answers.put({"session": journal.session, "pid": os.getpid(), "host": socket.gethostname()})
        recorded.set()
        release.wait(60)


def record_and_report(path: str, run: str, answers) -> None:
    """Record step 1 of `run` and send back this session's id and the warnings the library logged."""
    from stepjournal import Journal

    warnings = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(dict(getattr(record, "stepjournal", {"event": record.getMessage()})))

    logging.getLogger("stepjournal").addHandler(Collect(logging.WARNING))
    with Journal(path, run=run) as journal:
        journal.record(1, {"who": "second"})
        answers.put({"session": journal.session, "warnings": warnings})
