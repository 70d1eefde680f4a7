"""An interrupt (Ctrl-C's `KeyboardInterrupt`) can land at any line of the group commit: wherever it lands
in the main thread, as a group's first leader, as the follower the lead is handed to, or as a follower
of another's group, the other threads finish, each acknowledged record is in the log once, nothing is
written twice, the journal verifies and records on (storage/_appender.py).

The interrupt is raised by a trace function at the line it is aimed at (an observed point: the line
about to run), as Python's SIGINT handler raises it between two bytecodes of the main thread. The lines
swept are those the main thread runs in its role, found by running the role once untouched, less those
that begin with a no-op (``try:``): no signal is handled there, and the interpreter's exception table
does not cover them (an exception a trace function raised there would skip a ``with``'s exit).
"""

from __future__ import annotations

import collections
import dis
import linecache
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import pytest

from stepjournal import Journal
from stepjournal.errors import JournalError
from stepjournal.events import GenerationRecorded
from stepjournal.storage import _appender  # private: the lines of the appender swept
from stepjournal.storage._appender import appender_of  # private: the group commit's observation point (internal seam)

RESPONSE = {"text": "x" * 256}
FOLLOWERS = 3
WAIT_S = 60  # a bound on each observed wait, so that a hang fails the test instead of hanging it
MAIN = 100  # the main thread's record's call index; the first group's is 0, the followers' 1..FOLLOWERS
SOURCE = _appender.__file__


def _no_op_lines() -> Set[int]:
    """The appender's lines whose first instruction is a NOP (a ``try:``)."""
    found: Set[int] = set()
    codes = [compile(open(SOURCE).read(), SOURCE, "exec")]
    while codes:
        code = codes.pop()
        codes.extend(c for c in code.co_consts if hasattr(c, "co_code"))
        starts = dict(dis.findlinestarts(code))
        for ins in dis.get_instructions(code):
            if ins.offset in starts and ins.opname == "NOP":
                found.add(starts[ins.offset])
    return found


class _Scene:
    """Threads recording into one journal, their groups made at observed points (`Appender.observe`)."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal
        self.out: Dict[int, Any] = {}
        self.queued: Set[int] = set()  # the threads (idents) whose record joined the queue
        self.changed = threading.Condition()
        self.release = threading.Event()  # lets the first group's leader (or the blocking write) go on
        self.first = True
        self.taken = threading.Event()  # the first group's leader took its group (of its own record)
        self.threads: List[threading.Thread] = []
        appender_of(journal).observe = self._observe

    def _observe(self, point: str, count: int) -> None:
        if point == "queued":
            with self.changed:
                self.queued.add(threading.get_ident())
                self.changed.notify_all()
        elif point == "taken" and self.first:
            self.first = False
            self.taken.set()
            assert self.release.wait(WAIT_S)

    def record(self, index: int) -> None:
        try:
            self.out[index] = self.journal.record(1, RESPONSE, gen_index=index, stage="tool:calc").seq
        except BaseException as exc:  # the test looks at it
            self.out[index] = exc
        finally:
            with self.changed:
                self.changed.notify_all()

    def start(self, index: int, target: Optional[Callable[[], None]] = None) -> threading.Thread:
        thread = threading.Thread(target=target or (lambda: self.record(index)), daemon=True)
        thread.start()
        self.threads.append(thread)
        return thread

    def wait_queued(self, thread: Any, index: int) -> None:
        """Until `thread`'s record is queued, or its call is over (an interrupt before it queued)."""
        ident = thread if isinstance(thread, int) else thread.ident
        with self.changed:
            assert self.changed.wait_for(lambda: ident in self.queued or index in self.out, WAIT_S)


def _scene_main_handed_the_lead(scene: _Scene, main: int, go: Callable[[], None]) -> None:
    """The main thread queues first behind the first group's leader: it leads the next group."""
    scene.start(0)
    assert scene.taken.wait(WAIT_S)
    _main_then_followers(scene, main, go, range(1, FOLLOWERS + 1))


def _scene_main_a_follower(scene: _Scene, main: int, go: Callable[[], None]) -> None:
    """Another thread queues first behind the first group's leader and leads the next group, the main thread's
    record in it."""
    scene.start(0)
    assert scene.taken.wait(WAIT_S)
    leader = scene.start(1)
    scene.wait_queued(leader, 1)
    _main_then_followers(scene, main, go, range(2, FOLLOWERS + 2))


def _scene_main_the_first_leader(scene: _Scene, main: int, go: Callable[[], None]) -> None:
    """The main thread finds no leader and leads, while a write (a prune, a pull) holds the write lock until
    the followers queued behind it: its group holds them."""
    scene.first = False  # no group to hold: the write holds the lock
    holding = threading.Event()
    writer = scene.start(-1, target=lambda: appender_of(scene.journal).write(
        lambda txn: (holding.set(), scene.release.wait(WAIT_S))))
    assert holding.wait(WAIT_S)
    _main_then_followers(scene, main, go, range(1, FOLLOWERS + 1))
    writer.join(WAIT_S)


def _main_then_followers(scene: _Scene, main: int, go: Callable[[], None], indices: Any) -> None:
    """The main thread records (`go`); once it queued (or its call is over), the followers queue one by one
    behind it, and then the first group (or the blocking write) is let go."""

    def followers() -> None:
        scene.wait_queued(main, MAIN)
        for index in indices:
            scene.wait_queued(scene.start(index), index)
        scene.release.set()

    helper = threading.Thread(target=followers, daemon=True)
    helper.start()
    go()
    helper.join(WAIT_S)


SCENES = {"handed the lead": _scene_main_handed_the_lead, "a follower": _scene_main_a_follower,
          "the first leader": _scene_main_the_first_leader}


def _run(path: str, scene_of: Callable[..., None], line: Optional[int]) -> Tuple[_Scene, Set[int]]:
    """Run the scene, the main thread interrupted at the first run of `line` of the appender (None: not
    interrupted); return it and the appender's lines the main thread ran."""
    ran: Set[int] = set()
    fired = [False]

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            ran.add(frame.f_lineno)
            if frame.f_lineno == line and not fired[0]:
                fired[0] = True
                raise KeyboardInterrupt
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        return local if frame.f_code.co_filename == SOURCE else None

    journal = Journal(path)
    scene = _Scene(journal)

    def go() -> None:
        sys.settrace(tracer)
        try:
            scene.record(MAIN)
        finally:
            sys.settrace(None)
            scene.release.set()  # interrupted before it queued: the others go on without it

    scene_of(scene, threading.get_ident(), go)
    deadline = time.monotonic() + WAIT_S  # one bound for all: a hang costs it once
    for thread in scene.threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    scene.hung = [t for t in scene.threads if t.is_alive()]  # type: ignore[attr-defined]
    return scene, ran


def _problems(path: str, scene: _Scene) -> List[str]:
    """What the interrupt broke: a hang, a lost or doubled record, a journal that no longer verifies or records."""
    problems = []
    if scene.hung:  # type: ignore[attr-defined]
        problems.append(f"{len(scene.hung)} thread(s) never returned")  # type: ignore[attr-defined]
        return problems  # the journal is still in use by them
    journal = scene.journal
    after: Dict[int, Any] = {}
    again = threading.Thread(target=lambda: after.setdefault(0, journal.record(2, RESPONSE).seq), daemon=True)
    again.start()
    again.join(WAIT_S)
    if again.is_alive():
        return problems + ["a record after the interrupt never returned"]
    counts = collections.Counter(e.gen_index for _s, e in journal.events(types=[GenerationRecorded]) if e.step == 1)
    for index, outcome in sorted(scene.out.items()):
        if index < 0:
            continue
        if counts[index] > 1:
            problems.append(f"record {index} written {counts[index]} times")
        if isinstance(outcome, int):
            if counts[index] != 1 or journal.event(outcome).gen_index != index:
                problems.append(f"record {index} acknowledged as #{outcome} but not in the log there")
        elif index != MAIN and counts[index] and not (isinstance(outcome, JournalError) and "may be in" in str(outcome)):
            problems.append(f"record {index} failed with {outcome!r} and is in the log")
        elif index != MAIN and not isinstance(outcome, Exception):
            problems.append(f"record {index}, not the interrupted caller's, got {outcome!r}")
    if journal.verify():
        problems.append(f"verify: {journal.verify()}")
    if len(journal.sessions()) != 1:
        problems.append(f"{len(journal.sessions())} sessions")
    journal.close()
    return problems


@pytest.mark.parametrize("role", sorted(SCENES))
def test_an_interrupt_at_any_line_of_the_group_commit_loses_hangs_and_doubles_nothing(tmp_path, role):
    scene_of = SCENES[role]
    scene, lines = _run(str(tmp_path / "plain"), scene_of, None)
    assert not _problems(str(tmp_path / "plain"), scene)
    assert isinstance(scene.out[MAIN], int) and len(lines) > 20, (scene.out, sorted(lines))
    broken = []
    for line in sorted(lines - _no_op_lines()):
        path = str(tmp_path / f"line{line}")
        scene, _ = _run(path, scene_of, line)
        found = _problems(path, scene)
        if found:
            broken.append(f"line {line} ({linecache.getline(SOURCE, line).strip()}): {'; '.join(found)}")
    assert not broken, "\n".join(broken)
