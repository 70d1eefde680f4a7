"""Crash safety: writers SIGKILLed at seeded points of their work leave a journal that opens, verifies
and resumes.

After every kill: the journal opens, `verify` finds nothing, the recorded steps are exactly the
steps the writers had been told were committed, plus at most the one call that was in flight, each
step is recorded once, every new step holds the bytes the writer generated, and the next writer
(a restarted training loop with the ``cache`` policy) replays what is there and generates the rest.

The writers stop at each point of their work (each line they acknowledge, each write into LMDB, each
commit) and wait for the parent (tests/kill_points.py), which kills them at one of those points or
right after letting them go on from there (inside the commit and its fsync): never after a delay.
"""

from __future__ import annotations

import os
import random
import shutil
import threading

import pytest
import torch

from stepjournal import Journal
from stepjournal.events import GenerationRecorded
from stepjournal.upkeep import compact

from kill_points import start_process
from reliability_support import expected_output, report, same_output, worker_context
from reliability_workers import crash_writer, hold_reader, locked_writer


def _read_lines(path: str) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [line for line in fh.read().split("\n") if line]


def _check_journal_after_kill(path: str, acked_max: int, in_flight: int | None, checked_upto: int) -> int:
    """Assert the journal state a kill must leave; return the number of recorded steps. A kill between a
    payload file and its event leaves a file no event names (whole, or half written in tmp/): verify
    names it, and nothing else."""
    with Journal(path, run="crash", readonly=True) as journal:
        assert {p.kind for p in journal.verify()} <= {"orphan_file", "partial_file"}
        steps = journal.recorded_steps()
        count = len(steps)
        assert steps == list(range(1, count + 1)), "recorded steps have a gap"
        assert count >= acked_max, f"acknowledged step {acked_max} was lost (journal ends at {count})"
        assert count == acked_max or (count == acked_max + 1 and in_flight == count), (
            f"journal holds {count} steps; {acked_max} were acknowledged and the call in flight was {in_flight}"
        )
        generated = [e.step for _, e in journal.events(run="crash", types=[GenerationRecorded])]
        assert sorted(generated) == steps, "a step was recorded twice"
        for step in range(checked_upto + 1, count + 1):
            assert same_output(journal.load_output(journal.lookup(step)), expected_output(step))
    return count


def _nth_file_step(n: int):
    """A `run_to` stop at the `n`-th step of writing a payload file (its new file opened in tmp/, its rename)."""
    seen = [0]

    def stop(label: str) -> bool:
        seen[0] += label.startswith(_FILE_WRITE)
        return seen[0] == n

    return stop


_FILE_WRITE = ("open tmp/", "os.rename tmp/")


def kill_loop(tmp_path, kills: int, *, context: str = "forkserver", seed: int = 8, reach: int = 120,
              file_kills: int = 0) -> dict:
    """Start a resuming writer `kills` times and SIGKILL it at a seeded one of its first `reach` points
    (its open and two replays take about 20, a call about 10); the first `file_kills` times, at a seeded
    one of its first four steps of writing a payload file instead; check after each."""
    rng = random.Random(seed)
    ctx = worker_context(context)
    path = str(tmp_path / "journal")
    Journal(path, run="crash").close()
    acked_max = recorded = 0
    figures = {"kills": 0, "kills_in_flight": 0, "in_flight_committed": 0, "kills_in_a_write": 0,
               "kills_in_a_file": 0, "replayed": 0, "generated": 0}
    os.makedirs(tmp_path, exist_ok=True)
    for k in range(kills):
        ack = str(tmp_path / f"ack{k}")
        release = rng.random() < 0.5
        child = start_process(ctx, crash_writer, path, ack, "crash", 0)
        if k < file_kills:
            said = child.run_to(_nth_file_step(rng.randint(1, 4)), release=release)
            figures["kills_in_a_file"] += said[-1].startswith(_FILE_WRITE) or release  # released: just past it
        else:
            said = child.kill_at(rng.randint(1, reach), release=release)
        # Waiting inside a write transaction, or inside one (or its commit) on the way to the next point.
        figures["kills_in_a_write"] += said[-1].startswith("lmdb ") and said[-1] != "lmdb committed"
        lines = _read_lines(ack)
        assert not [line for line in lines if line.startswith("X")], f"kill {k}: a replay differed: {lines}"
        done = [int(line[1:]) for line in lines if line[0] in "AR"]
        opened = [int(line[1:]) for line in lines if line[0] == "O"]
        if opened:
            # The writer resumed one step before the end of what was recorded (a checkpoint).
            assert opened[0] == max(1, recorded - 1)
        # What an earlier check found committed counts as acknowledged from then on.
        acked_max = max([acked_max, recorded, *done])
        in_flight = int(lines[-1][1:]) if lines and lines[-1][0] == "B" else None
        count = _check_journal_after_kill(path, acked_max, in_flight, recorded)
        figures["kills"] += 1
        figures["kills_in_flight"] += in_flight is not None
        figures["in_flight_committed"] += in_flight is not None and count == in_flight
        figures["replayed"] += sum(line[0] == "R" for line in lines)
        figures["generated"] += sum(line[0] == "A" for line in lines)
        recorded = count
        if os.path.exists(ack):
            os.unlink(ack)
    # A last run that is not killed continues where the killed ones stopped.
    ack = str(tmp_path / "ack-final")
    proc = ctx.Process(target=crash_writer, args=(path, ack, "crash", 4))
    proc.start()
    proc.join(120)
    assert proc.exitcode == 0
    lines = _read_lines(ack)
    assert lines[0] == f"O{max(1, recorded - 1)}" and lines[-1] == "E"
    assert [line[0] for line in lines if line[0] in "ARX"] == ["R"] * min(2, recorded) + ["A"] * (4 - min(2, recorded))
    final = _check_journal_after_kill(path, recorded + 4 - min(2, recorded), None, recorded)
    figures["files_left"] = compact(path).files_removed  # what the kills left, removed
    with Journal(path, readonly=True) as journal:
        assert journal.verify() == []
        figures["journal_bytes"] = os.path.getsize(os.path.join(path, "data.mdb"))
        figures["events"] = journal.last_seq()
    figures["steps_recorded"] = final
    figures["lost"] = 0
    shutil.rmtree(path)  # a round leaves GBs; pytest keeps the temp folders of the last runs
    return figures


def test_fifty_random_sigkills_lose_nothing_acknowledged_and_resume(tmp_path):
    """≥ 50 kills at seeded points, large payloads, a resuming `cache` writer each time."""
    figures = kill_loop(tmp_path, 50, file_kills=4)
    assert figures["kills"] == 50 and figures["kills_in_flight"] > 0
    assert figures["in_flight_committed"] > 0 and figures["kills_in_a_write"] > 0 and figures["kills_in_a_file"] >= 4
    report("crash", **figures, context="forkserver")


@pytest.mark.soak
def test_five_hundred_random_sigkills_lose_nothing_acknowledged_and_resume(tmp_path):
    totals: dict = {}

    def add(figures: dict) -> None:
        for key, value in figures.items():
            merge = max if key == "journal_bytes" else (lambda a, b: a + b)
            totals[key] = merge(totals.get(key, 0), value)

    for round_ in range(10):  # a fresh journal every 50 kills keeps verify-after-each-kill affordable
        add(kill_loop(tmp_path / f"round{round_}", 50, seed=1000 + round_, reach=300, file_kills=6))
    add(kill_loop(tmp_path / "spawned", 20, context="spawn", seed=7))
    assert totals["kills"] == 520 and totals["kills_in_flight"] > 0
    assert totals["in_flight_committed"] > 0 and totals["kills_in_a_write"] > 0
    assert totals["kills_in_a_file"] >= 50  # issue 29: ≥ 50 kills inside the writing of a payload file
    report("crash_soak", **totals, context="forkserver (500) + spawn (20)")


def test_stale_reader_slots_of_killed_processes_are_reclaimed(tmp_path):
    """Processes killed inside a read transaction leave no slot that blocks other readers for good.

    LMDB keeps a reader table of 256 slots; a process killed while reading leaves its slot taken
    until someone clears it. While another process keeps the journal open, the table would fill.
    """
    ctx = worker_context()
    path = str(tmp_path / "journal")
    kills = 300
    with Journal(path, run="main") as journal:
        journal.record(1, {"a": 1})
        for k in range(kills):
            assert start_process(ctx, hold_reader, path).kill_at(1)[-1] == "reading"  # killed inside its read
            journal.record(k + 2, {"a": k})
            assert journal.last_seq() == k + 3
        assert journal.verify() == []
    report("stale_readers", killed_readers=kills)


def _record_in_thread(path: str, step: int, timeout: float) -> bool:
    result = []

    def body():
        with Journal(path, run="after-kill") as journal:
            journal.record(step, {"x": torch.zeros(4)})
            result.append([p for p in journal.verify() if p.kind != "orphan_file"])

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    thread.join(timeout)
    return result == [[]]


class _NthWrite:
    """A `run_to` stop at the `n`-th point inside a write transaction (a write, or the start of a commit)."""

    def __init__(self, n: int) -> None:
        self.left, self.label = n, ""

    def __call__(self, label: str) -> bool:
        if label == "lmdb committed":
            return False
        self.left -= 1
        self.label = label
        return self.left == 0


def test_writer_killed_inside_its_transaction_does_not_block_the_next_writer(tmp_path):
    """LMDB's writer mutex is robust: the next writer recovers it instead of waiting forever."""
    ctx = worker_context()
    path = str(tmp_path / "journal")
    Journal(path).close()
    rng = random.Random(3)
    inside = 0
    for k in range(8):
        # At a write of its open's transaction or of its first two records' (each after a 48 MB payload
        # file), or at the start of a commit; released, the kill lands on the way from there (into the commit).
        release, stop = rng.random() < 0.5, _NthWrite(rng.randint(1, 16))
        start_process(ctx, locked_writer, path, 48 << 20).run_to(stop, release=release)
        # Killed waiting inside the transaction, or on the way to its next write or commit: inside it.
        inside += not (release and stop.label == "lmdb commit")
        assert _record_in_thread(path, k, timeout=60), f"the writer after kill {k} could not record"
    assert inside >= 4, inside  # the rest were released into a commit: inside it, or just past it
    with Journal(path, readonly=True) as journal:  # a killed record's payload file, whole, that no event names
        assert {p.kind for p in journal.verify()} <= {"orphan_file"}
        assert journal.recorded_steps(run="after-kill") == list(range(8))
