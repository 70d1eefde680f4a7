"""The fingerprint each session opened with, as one journal handle reads it.

Read from the `sessions` index, or, where the index lacks the session (a journal without that index
opened read-only, a session opened by an older version of stepjournal), by a scan of the log. Each
answer is remembered: events never change once written.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

from ..base._errors import EventDecodeError, IntegrityError
from ..events._convert import decode_event
from ..events._events import SessionOpened

__all__ = ["SessionFingerprints"]


class SessionFingerprints:
    """A journal handle's reader of its sessions' fingerprints.

    Args:
        path: the journal's folder (for messages).
        log: its `EventLog`.
        index: its `Projections` (``session_seq``).
        live: returns its open `Store` (raises once the journal is closed).
    """

    def __init__(self, path: str, log: Any, index: Any, live: Callable[[], Any]) -> None:
        self._path, self._log, self._index, self._live = path, log, index, live
        self._known: Dict[str, Dict[str, Any]] = {}

    def clear(self) -> None:
        """Forget every answer (after `reindex`)."""
        self._known.clear()

    def of(self, session: str) -> Dict[str, Any]:
        """The fingerprint recorded when `session` opened (one read of the sessions index).

        Raises:
            IntegrityError: no `SessionOpened` event of `session` (names damaged events met on the way).
        """
        found = self._known.get(session)
        if found is None:
            seq = self._index.session_seq(self._live(), session)
            if seq is not None:
                raw = self._log.get_raw(seq)
                event = decode_event(raw, seq=seq) if raw is not None else None
                if isinstance(event, SessionOpened) and event.session == session:
                    found = self._known[session] = event.fingerprint
        return found if found is not None else self._scanned(session)

    def _scanned(self, session: str) -> Dict[str, Any]:
        damaged: List[int] = []
        # One damaged event elsewhere in the log must not make every replay fail: skip it here
        # (verify reports it), unless it is the session asked for.
        for seq, raw in self._log.raw_events():
            try:
                event = decode_event(raw, seq=seq)
            except EventDecodeError:
                damaged.append(seq)
                continue
            if isinstance(event, SessionOpened):
                self._known[event.session] = event.fingerprint
        found = self._known.get(session)
        if found is None:
            hint = f"; events {damaged[:10]} are damaged (run `stepjournal verify`)" if damaged else ""
            raise IntegrityError(f"session {session!r} has no SessionOpened event in {self._path!r}{hint}")
        return found
