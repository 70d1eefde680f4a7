"""Kill a child process at an observed point of its work, never after a delay (the kill tests' helper).

A child in lockstep stops at each point it is watched at: a `progress=` callback of the public API,
a write call into LMDB (and the commit of the transaction that made it), or a filesystem step (from
Python's audit events). It tells the parent which point (one message on a pipe) and waits for its
answer. The parent answers until the point it chose (with a seeded RNG, over all the points the work
has: `kill_plan`), then SIGKILLs the child there: while it waits, so the kill lands exactly at that
point; or right after answering ("released"), so it lands on the way to the next point (inside an
LMDB commit, an fsync, an upload) and at the latest there. Either way the child is alive when killed
and how far it got is known from what it said, however fast or loaded the machine is. Ctrl-C lands
at a point the same way: the parent answers it with `Child.interrupt`, and the child sends itself SIGINT
there.

Nothing is replaced: the child runs the real operation on real LMDB, files and S3 server; the points
are observed through a callback, `sys.setprofile` (LMDB's calls are C calls) and `sys.addaudithook`.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

FD_ENV = "STEPJOURNAL_TEST_LOCKSTEP_FD"
TESTS = os.path.dirname(os.path.abspath(__file__))
# A bound on each wait for the child (its next point, its end), so that a hung child fails the test instead of
# hanging the suite. It is no measure of the work: a fresh interpreter importing torch beside a full `make test`
# and two CPU burners on two cores takes minutes to reach its first point, so the bound is far above that.
HANG_S = 1800
INTERRUPT = "SIGINT"  # the parent's answer that interrupts the child at its point (`Child.interrupt`)
_LMDB_WRITES = frozenset({"put", "putmulti", "delete", "replace", "pop", "drop"})
_LMDB_ENDS = frozenset({"commit", "__exit__"})
_FILE_STEPS = frozenset({"open", "os.fsync", "os.rename", "os.mkdir", "os.rmdir", "os.remove", "os.chmod",
                         "os.truncate", "os.listdir", "os.scandir", "shutil.rmtree"})


# -- the child's side ------------------------------------------------------------------------------
class Lockstep:
    """The child's side: `point(label)` tells the parent where the child is and waits for its answer."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._one_at_a_time = threading.Lock()  # a thread of the work (a staged file's) has points too
        if threading.current_thread() is threading.main_thread():
            # Ctrl-C reaches a terminal's foreground process, whose SIGINT Python turns into KeyboardInterrupt.
            # A process started under a shell's background job inherits SIGINT ignored (POSIX: a non-interactive
            # shell's `&` ignores it), and Python then installs no handler: `Child.interrupt` would do nothing.
            signal.signal(signal.SIGINT, signal.default_int_handler)

    @classmethod
    def inherited(cls) -> "Lockstep":
        """The pipe `start_script` gave this process (its descriptor is in ``STEPJOURNAL_TEST_LOCKSTEP_FD``)."""
        return cls(Connection(int(os.environ[FD_ENV])))

    def point(self, label: str) -> None:
        with self._one_at_a_time:
            self._conn.send(label)
            answer = self._conn.recv()  # the parent answers, or kills this process while it waits here
            if answer == INTERRUPT:  # Ctrl-C at this point, sent to the process as a terminal sends it: Python's
                os.kill(os.getpid(), signal.SIGINT)  # handler raises KeyboardInterrupt in the main thread, here

    def progress(self, what: str, done: int, total: int) -> None:
        """A `progress=` callback (push, pull): a point ``"<what> <done>/<total>"`` after each piece."""
        self.point(f"{what} {done}/{total}")

    @contextmanager
    def lmdb_writes(self) -> Iterator[None]:
        """A point before each write call into LMDB on this thread (``lmdb put`` ...), before the end
        of each transaction that wrote (``lmdb commit``: its commit, or its abort on an error) and
        after it (``lmdb committed``)."""
        import lmdb

        kinds = (lmdb.Transaction, lmdb.Cursor)
        wrote = [False]  # since the last end of a transaction (one write transaction at a time a thread)

        def watch(frame: Any, event: str, arg: Any) -> None:
            if event != "c_call" and event != "c_return":
                return
            owner = getattr(arg, "__self__", None)
            if not isinstance(owner, kinds):
                return
            name = arg.__name__
            if name in _LMDB_WRITES:
                if event == "c_call":
                    wrote[0] = True
                    self.point(f"lmdb {name}")
            elif isinstance(owner, lmdb.Transaction) and wrote[0]:
                if name == "abort":
                    wrote[0] = False
                elif name in _LMDB_ENDS and event == "c_call":
                    self.point("lmdb commit")
                elif name in _LMDB_ENDS:
                    wrote[0] = False
                    self.point("lmdb committed")

        before = sys.getprofile()
        sys.setprofile(watch)
        try:
            yield
        finally:
            sys.setprofile(before)

    def filesystem(self, folder: str) -> Callable[[bool], None]:
        """A point before each filesystem step under `folder` (``os.rename <path>`` ...) while on.

        Audit hooks stay for the life of the process: the returned switch turns the points on and off.
        """
        folder = os.path.realpath(folder)
        state = {"on": False}
        within = threading.local()  # this thread's own point is being told (its steps are not points)

        def hook(event: str, args: Tuple[Any, ...]) -> None:
            if event == "stepjournal.owned_path":  # a step relative to a folder's descriptor, with its path
                event, args = args[0], args[1:]
            elif _relative_to_a_folder(event, args):
                return  # told by its stepjournal.owned_path event
            if not state["on"] or getattr(within, "point", False) or event not in _FILE_STEPS or not args:
                return
            where = args[0]
            if isinstance(where, bytes):
                where = os.fsdecode(where)
            if event == "os.truncate" and isinstance(where, int):  # a descriptor: the only ones truncated are ours
                where = f"fd:{where}"
            elif not isinstance(where, str) or not os.path.realpath(where).startswith(folder):
                return
            within.point = True
            try:
                where = os.path.relpath(where, folder) if where.startswith("/") else where
                self.point(f"{event} {where.replace(str(os.getpid()), '<pid>')}")  # the same in each run
            finally:
                within.point = False

        sys.addaudithook(hook)
        return lambda on: state.__setitem__("on", on)


def _relative_to_a_folder(event: str, args: Tuple[Any, ...]) -> bool:
    """Whether the interpreter's event `event` is a step on a name relative to a folder's descriptor."""
    dir_fd = {"os.rename": 2, "os.mkdir": 2, "os.remove": 1, "os.rmdir": 1}.get(event)
    return dir_fd is not None and len(args) > dir_fd and isinstance(args[dir_fd], int) and args[dir_fd] >= 0


# -- the parent's side -----------------------------------------------------------------------------
class Child:
    """The parent's side of a child in lockstep: its points one by one, and its kill."""

    def __init__(self, conn: Connection, pid: int, wait: Callable[[float], Optional[int]]) -> None:
        self.conn, self.pid, self._wait = conn, pid, wait
        self.seen: List[str] = []

    def next_point(self, timeout: float = HANG_S) -> Optional[str]:
        """The point the child now waits at (it waits until `go`); None when it ended instead."""
        try:
            if not self.conn.poll(timeout):
                raise AssertionError(f"the child said nothing for {timeout} s after {self.seen[-3:]}")
            label = self.conn.recv()
        except (EOFError, ConnectionError):
            return None
        self.seen.append(label)
        return label

    def go(self) -> None:
        self.conn.send(None)

    def interrupt(self) -> None:
        """Ctrl-C at the point the child waits at: it sends itself SIGINT there (`Lockstep.point`), so Python
        raises KeyboardInterrupt in its main thread at that point when the point is the main thread's, else
        wherever the main thread is while the point's thread goes on. A SIGINT sent from here lands where the
        kernel delivers it and Python next looks, which a loaded machine may put after the child went on."""
        self.conn.send(INTERRUPT)

    def run_to(self, stop: Callable[[str], bool], *, release: bool = False) -> List[str]:
        """Let the child go on to the first point `stop` accepts and SIGKILL it there (or, `release`d,
        right after letting it go on from there); return the points it reached.

        Raises AssertionError when the child ends before (the kill would not land mid-operation) or
        was not alive to be killed.
        """
        try:
            while True:
                label = self.next_point()
                assert label is not None, f"the child ended before the chosen point, after {self.seen[-3:]}"
                if stop(label):
                    break
                self.go()
            if release:
                self.go()
        finally:  # and when the test fails: a child left running would go on writing
            os.kill(self.pid, signal.SIGKILL)
        code = self._wait(HANG_S)
        assert code == -signal.SIGKILL, f"the child was not alive to be killed (exit status {code})"
        while True:  # what it said before the signal landed (a released child may reach its next point)
            try:
                if not self.conn.poll(0):
                    break
                self.seen.append(self.conn.recv())
            except (EOFError, ConnectionError):
                break
        self.conn.close()
        return self.seen

    def kill_at(self, n: int, *, release: bool = False) -> List[str]:
        """`run_to` the child's `n`-th point (counted from 1)."""
        reached = [0]

        def nth(_label: str) -> bool:
            reached[0] += 1
            return reached[0] == n

        return self.run_to(nth, release=release)

    def finish(self, timeout: float = HANG_S, *, exits: Tuple[int, ...] = (0,)) -> List[str]:
        """Answer every point until the child ends; return them all. Raises when its exit status is not
        one of `exits`."""
        try:
            while self.next_point(timeout) is not None:
                self.go()
        except BaseException:
            os.kill(self.pid, signal.SIGKILL)
            raise
        code = self._wait(timeout)
        self.conn.close()
        assert code in exits, f"the child exited with {code} after {self.seen[-3:]}"
        return self.seen


def child_env(env: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    """`env` (default: this process's) with tests/ importable, as a child script needs for `Lockstep`."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join([TESTS, *filter(None, [out.get("PYTHONPATH")])])
    return out


def start_script(code: str, *args: str, env: Optional[Dict[str, str]] = None) -> Child:
    """Run `code` (``python -c``) in lockstep; it reaches its end of the pipe with `Lockstep.inherited`."""
    mine, theirs = mp.Pipe()
    env = child_env(env)
    env[FD_ENV] = str(theirs.fileno())
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env, pass_fds=[theirs.fileno()],
                            stdout=subprocess.DEVNULL)
    theirs.close()

    def wait(timeout: float) -> Optional[int]:
        return proc.wait(timeout)

    return Child(mine, proc.pid, wait)


def start_process(ctx: Any, target: Callable[..., None], *args: Any) -> Child:
    """Start `target(*args, lockstep_conn)` in a process of the multiprocessing context `ctx`, in lockstep."""
    mine, theirs = mp.Pipe()
    proc = ctx.Process(target=target, args=(*args, theirs))
    proc.start()
    theirs.close()

    def wait(timeout: float) -> Optional[int]:
        proc.join(timeout)
        return proc.exitcode

    return Child(mine, proc.pid, wait)


def nth_after(first: str, n: int) -> Callable[[str], bool]:
    """A `Child.run_to` stop at the `n`-th point after the point `first` (``"recorded 3"``)."""
    left = [None]

    def stop(label: str) -> bool:
        if left[0] is None:
            left[0] = n if label == first else None
            return False
        left[0] -= 1
        return left[0] == 0

    return stop


def kill_plan(rng: random.Random, points: int, kills: int) -> List[Tuple[int, bool]]:
    """Where `kills` successive kills land among `points` points (1..points, each a kill mid-operation):
    one in each of `kills` equal stretches, so early, middle and late all get some; each with whether
    to release the child there. Released only where the point after it is mid-operation too and not
    the next kill's, so that wherever the released kill lands, the next kill's point is still ahead.
    """
    assert 0 < kills <= points, (kills, points)
    chosen = [rng.randint(k * points // kills + 1, (k + 1) * points // kills) for k in range(kills)]
    after = chosen[1:] + [points + 1]
    return [(at, rng.random() < 0.5 and at + 1 < nxt and at + 1 <= points) for at, nxt in zip(chosen, after)]
