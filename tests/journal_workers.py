"""Process targets of the journal-room tests (importable by spawned children)."""

from __future__ import annotations

import os


def record_steps(path: str, run: str, steps: int, ack_path: str) -> None:
    """Record `steps` calls under `run`, writing ``<step>`` to `ack_path` after each `record` returned."""
    from stepjournal import Journal

    fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        with Journal(path, run=run) as journal:
            for step in range(steps):
                journal.record(step, {"step": step, "run": run})
                os.write(fd, f"{step}\n".encode())
    finally:
        os.close(fd)
