"""Live writers: which session is recording a run (and mode) of a journal right now, told through a lock file.

Two sessions of one run and mode recording at once (a job started twice, a restarted job whose old process
still runs) each count generation indices from zero, so both record step N index 0 and the later
record silently wins the step index. The journal keeps both (the log is the truth, and refusing
would kill a training run over a mistake it can keep working through) and warns, naming the other
session, its host and pid.

A session that records a generation holds an exclusive `flock` on ``writer-<digest>.lock`` (of the
run and the mode) in the journal folder and writes who it is into the file; the kernel drops the lock when the process
ends, however it ends, so a held lock always means a live writer. LMDB's reader table cannot tell
this: a session holds a reader slot only during a transaction. The lock is per mode, so the
processes of a multi-process trainer, each recording its own mode (``train/p0``, ``train/p1``), are
not taken for two sessions of one run. Where `fcntl` does not exist
(Windows) or the folder cannot take the file, nothing is detected and nothing fails.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from typing import Any, Dict, List, Optional

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Windows
    fcntl = None  # type: ignore[assignment]

from .events._events import Event, GenerationRecorded
from .base._log import get_logger
from .base._owned import closing, open_file, open_root
from .base._paths import writer_lock_name

__all__ = ["RunWriter", "WriterLock"]

log = get_logger("stepjournal._journal")

_MAX_INFO_BYTES = 4096


class WriterLock:
    """The lock file of one (journal folder, run, mode), opened by one session.

    Args:
        folder: the journal folder.
        run: the run key.
        session: this session's id; with its host and pid it is written into the file once held.
        mode: the mode recorded.
    """

    def __init__(self, folder: str, run: str, session: str, mode: str = "train") -> None:
        self.run = run
        self.mode = mode
        self.me = {"session": session, "host": socket.gethostname(), "pid": os.getpid(), "ts": time.time()}
        self.held = False
        self._fd: Optional[int] = None
        self._seen: set = set()
        if fcntl is None:
            return
        name = writer_lock_name(run, mode)
        try:  # written in place: a link, a FIFO or a file with other names there is refused (UnsafePathError)
            with closing(open_root(folder)) as root:
                self._fd = open_file(root, name, os.O_RDWR | os.O_CREAT, where=os.path.join(folder, name),
                                     in_place=True)
        except OSError:
            return  # a read-only copy, a folder of someone else: no detection, never a failure

    def claim(self) -> Optional[Dict[str, Any]]:
        """Try to be the run's live writer; return the other live writer's details the first time one is met.

        Returns:
            None when this session holds the lock (or detection is unavailable, or the other writer
            was already reported); else what the other session wrote (``session``, ``host``,
            ``pid``, ``ts``; ``{}`` when it could not be read).
        """
        if self.held or self._fd is None:
            return None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = self._read_other(self._fd)
            key = (other.get("session"), other.get("pid"))
            if key in self._seen:
                return None
            self._seen.add(key)
            return other
        except OSError:
            return None
        self.held = True
        body = json.dumps(self.me).encode()
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, body, 0)
        return None

    def claim_or_warn(self, path: str) -> None:
        """`claim`, and log a warning naming the other live writer when one is met."""
        other = self.claim()
        if other is not None:
            log.warning(
                "run_recorded_by_two_sessions", path=path, run=self.run, mode=self.mode, session=self.me["session"],
                other_session=other.get("session"), other_host=other.get("host"), other_pid=other.get("pid"),
                hint="both sessions' calls are journaled and the later record of a step is the one replayed; "
                "stop the other process, or give each its own run key (Journal(path, run=...))",
            )

    def _read_other(self, fd: int) -> Dict[str, Any]:
        try:
            raw = os.pread(fd, _MAX_INFO_BYTES, 0)
            info = json.loads(raw.decode())
        except (OSError, ValueError):
            return {}
        return {k: info.get(k) for k in ("session", "host", "pid", "ts")} if isinstance(info, dict) else {}

    def close(self) -> None:
        """Give the lock up (closing the file releases it)."""
        fd, self._fd, self.held = self._fd, None, False
        if fd is not None:
            os.close(fd)

    def forget_in_fork_child(self) -> None:
        """In a fork child: close the inherited descriptor without releasing the parent's lock."""
        # flock belongs to the open file, shared with the parent: closing this copy leaves the
        # parent's lock in place, while LOCK_UN here would release it for both.
        self.close()


class RunWriter:
    """A journal's claim to be its run's live writer, taken before its session records a generation.

    Args:
        path: the journal folder (as given).
        run: the journal's run key.
    """

    def __init__(self, path: str, run: str) -> None:
        self.path = path
        self.run = run
        self._locks: Dict[str, WriterLock] = {}  # by mode
        self._mutex = threading.Lock()

    def held(self, mode: str = "train") -> bool:
        """Whether this journal's session is the live writer of its run in `mode`."""
        lock = self._locks.get(mode)
        return lock is not None and lock.held

    def before_append(self, events: List[Event], session: Optional[str]) -> None:
        """Claim (run, mode) when `events` record a generation of `session` in that mode; warn once per
        other live writer."""
        if session is None:
            return
        modes = {e.mode for e in events if isinstance(e, GenerationRecorded)}
        if all(self.held(mode) for mode in modes):
            return
        with self._mutex:
            for mode in modes:
                lock = self._locks.get(mode)
                if lock is None or lock.me["session"] != session:
                    if lock is not None:
                        lock.close()
                    lock = self._locks[mode] = WriterLock(os.path.realpath(self.path), self.run, session, mode)
                lock.claim_or_warn(self.path)

    def close(self) -> None:
        """Give the claims up (the journal closes)."""
        with self._mutex:
            locks, self._locks = list(self._locks.values()), {}
        for lock in locks:
            lock.close()

    def forget_in_fork_child(self) -> None:
        """In a fork child: drop the inherited claims, leaving them the parent's."""
        self._mutex = threading.Lock()  # another thread may have held it at fork()
        locks, self._locks = list(self._locks.values()), {}
        for lock in locks:
            lock.forget_in_fork_child()
