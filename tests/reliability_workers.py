"""Code that runs in the child processes of the reliability tests (importable by spawned children).

Each function is a process target. Children report through small files written unbuffered (one
``write`` per line), so what a SIGKILLed child had written before it died is on disk for the parent.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from contextlib import nullcontext
from typing import Any, List, Optional

from kill_points import Lockstep
from reliability_support import SIZES, expected_output, same_output


def _line(fd: int, text: str) -> None:
    os.write(fd, (text + "\n").encode())


# -- crash: a writer that is killed at a seeded point of its work --------------------------------------
def crash_writer(path: str, ack_path: str, run: str = "crash", stop_after: int = 0,
                 lockstep: Optional[Any] = None) -> None:
    """Resume the run the way a restarted training loop does, and record until killed.

    Protocol (one line each, written after the fact it states):
        ``O<step>``  opened; resuming at <step> (one step before the last recorded, as a checkpoint would)
        ``B<step>``  about to make the call of <step>
        ``A<step>``  the call was generated and `record` returned: acknowledged as committed
        ``R<step>``  the call was served from the journal, and the value equals what generating gives
        ``X<step>``  a replayed value differs from the generated one (the parent fails the test)
        ``E``        `stop_after` calls made; exiting normally

    With `lockstep` (the child's end of a `kill_points` pipe) each line is also a point the writer
    waits at, and so is each write into LMDB and each commit (the journal's open included), and each
    step of writing a payload file (its new file opened in ``payloads/tmp/``, its rename).
    """
    from stepjournal import Journal
    from stepjournal.adapters import journaled

    points = Lockstep(lockstep) if lockstep is not None else None
    fd = os.open(ack_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def say(text: str) -> None:
        _line(fd, text)
        if points is not None:
            points.point(text)

    if points is not None:
        points.filesystem(os.path.join(path, "payloads"))(True)
    with points.lmdb_writes() if points is not None else nullcontext():
        with Journal(path, run=run) as journal:
            recorded = journal.recorded_steps()
            start = max(1, recorded[-1] - 1) if recorded else 1
            say(f"O{start}")
            rollout = journaled(lambda step: expected_output(step), journal, "cache", input_of=None)
            step, made = start, 0
            while not stop_after or made < stop_after:
                say(f"B{step}")
                value = rollout(step=step)
                if rollout.last_outcome.action == "replayed":
                    say(f"{'R' if same_output(value, expected_output(step)) else 'X'}{step}")
                else:
                    say(f"A{step}")
                step += 1
                made += 1
    _line(fd, "E")
    os.close(fd)


def hold_reader(path: str, lockstep: Any) -> None:
    """Open the journal read-only, stay inside a read transaction, and say so (a `kill_points` point:
    the parent kills it while it waits there)."""
    from stepjournal import Journal

    journal = Journal(path, readonly=True)
    events = journal.raw_events()
    next(events)
    Lockstep(lockstep).point("reading")


def locked_writer(path: str, nbytes: int, lockstep: Any) -> None:
    """Record huge payloads in a loop (each commit is long), waiting at each write into LMDB and each
    commit (`kill_points` points); killed by the parent."""
    import torch

    from stepjournal import Journal

    with Lockstep(lockstep).lmdb_writes(), Journal(path, run="killed-writer") as journal:
        step = 0
        while True:
            step += 1
            journal.record(step, {"x": torch.full((nbytes // 8,), step, dtype=torch.int64)})


# -- concurrency: threads and async callers in several processes --------------------------------------
def concurrent_writer(path: str, proc: int, threads: int, per_thread: int, async_steps: int, fanout: int,
                      done_path: str) -> None:
    """Record from `threads` threads (one run, distinct steps) and from `fanout` async callers per step.

    Every call's identity and content derive from (proc, step, gen_index), so the parent can check
    each record without hearing from the child. Writes "ok" to `done_path` at the end.
    """
    import torch

    from stepjournal import Journal
    from stepjournal.adapters import journaled

    run = f"proc{proc}"
    errors: List[BaseException] = []
    with Journal(path, run=run, fingerprint={"proc": proc}, map_size=64 * 1024) as journal:

        def thread_body(t: int) -> None:
            try:
                for i in range(per_thread):
                    step = 1 + t + i * threads
                    journal.record(step, concurrent_payload(proc, step, 0), input={"step": step})
            except BaseException as exc:  # reported to the parent through done_path
                errors.append(exc)

        workers = [threading.Thread(target=thread_body, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()

        # The async callers of one step share the run and the engine: gen indices come from the engine.
        async def generate(step: int) -> dict:
            await asyncio.sleep(0)
            return {"step": step, "t": torch.zeros(16)}

        rollout = journaled(generate, journal, "dump", input_of=None)
        base = 1_000_000

        async def fan() -> None:
            for s in range(async_steps):
                await asyncio.gather(*(rollout(step=base + s) for _ in range(fanout)))

        try:
            asyncio.run(fan())
        except BaseException as exc:
            errors.append(exc)
        for w in workers:
            w.join()
    with open(done_path, "w") as fh:
        fh.write("ok" if not errors else "".join(f"{type(e).__name__}: {e}\n" for e in errors))


def concurrent_payload(proc: int, step: int, gen_index: int):
    import torch

    n = 512 + (step * 37 + proc * 101) % 4096
    return {"proc": proc, "step": step, "v": torch.arange(n, dtype=torch.int32) + proc * 1_000_003 + step}


def snapshot_reader(path: str, stop_path: str, out_path: str) -> None:
    """Read the journal in a loop while others write; check each snapshot holds only whole transactions.

    In one read transaction: event sequence numbers are gapless from 1, every event decodes, every
    stored output and input it references is present, and every index entry points at an event of
    that snapshot. Then through the public API: the audit's records load and verify. Writes
    "<snapshots> <max events seen> <payloads loaded>" or the first violation to `out_path`.
    """
    from stepjournal import Journal
    from stepjournal.events import GenerationRecorded
    from stepjournal.events._convert import decode_event  # private: raw event bytes, as stored

    snapshots = loaded = max_events = 0
    problem = ""
    journal = Journal(path, readonly=True)
    try:
        while not problem:
            stopping = os.path.exists(stop_path)
            store = journal._store
            with store.read() as txn:
                seqs = []
                refs = []
                for key, body in txn.cursor(db=store.db("events")):
                    seq = int.from_bytes(key, "big")
                    seqs.append(seq)
                    event = decode_event(body, seq=seq)
                    if isinstance(event, GenerationRecorded):
                        refs += [r for r in (event.output, event.input) if r is not None]
                if seqs != list(range(1, len(seqs) + 1)):
                    problem = f"sequence numbers are not gapless: {seqs[:5]}...{seqs[-5:]}"
                for ref in refs:
                    if txn.get(bytes.fromhex(ref.digest), db=store.db("payloads")) is None:
                        problem = f"an event references payload {ref.digest[:16]}, absent from its snapshot"
                for _, raw in txn.cursor(db=store.db("gen")):
                    if int.from_bytes(raw, "big") > len(seqs):
                        problem = "an index entry points past the snapshot's last event"
            max_events = max(max_events, len(seqs))
            records = journal.audit()
            for record in records[-20:]:
                if record.action == "generated":
                    recorded = journal.lookup(record.step, record.gen_index, run=record.run)
                    if recorded is not None:
                        journal.load_output(recorded)
                        loaded += 1
            snapshots += 1
            if stopping:
                break
    except BaseException as exc:
        problem = f"{type(exc).__name__}: {exc}"
    finally:
        journal.close()
    with open(out_path, "w") as fh:
        fh.write(problem or f"{snapshots} {max_events} {loaded}")


# -- corruption: look at a damaged journal from a process that may die of it ---------------------------
def inspect_journal(path: str, readonly: bool, out_path: str, run: str = "damage", sizes: tuple = SIZES) -> None:
    """Open, verify and replay every recorded step of a (damaged) journal; write what happened as JSON.

    Runs in a child so that a crash (SIGBUS, SIGSEGV) shows as the child's exit status, not as a dead
    test runner. Outputs are compared with `expected_output`: "served_wrong" lists steps whose value
    came back without an error but different; that is the one outcome that must never happen.
    """
    import json

    from stepjournal import Journal
    from stepjournal.errors import StepJournalError

    result: dict = {"opened": False, "error": None, "problems": [], "served_ok": 0, "served_wrong": [],
                    "refused": []}
    try:
        with Journal(path, run=run, readonly=readonly) as journal:
            result["opened"] = True
            result["problems"] = [[p.kind, list(p.steps)] for p in journal.verify()]
            try:
                steps = journal.recorded_steps()
            except StepJournalError as exc:
                steps = []
                result["refused"].append(["steps", type(exc).__name__, str(exc)])
            for step in steps:
                try:
                    recorded = journal.lookup(step)
                    if recorded is None:  # listed, then not found: the index's order is damaged
                        result["refused"].append([step, "lookup found nothing", "", None])
                        continue
                    value = journal.load_output(recorded)
                except StepJournalError as exc:
                    result["refused"].append([step, type(exc).__name__, str(exc), getattr(exc, "step", None)])
                    continue
                if same_output(value, expected_output(step, sizes)):
                    result["served_ok"] += 1
                else:
                    result["served_wrong"].append(step)
    except StepJournalError as exc:
        result["error"] = [type(exc).__name__, str(exc)]
    except Exception as exc:  # an untyped error is a finding; report it, do not crash
        result["error"] = ["UNTYPED " + type(exc).__module__ + "." + type(exc).__name__, str(exc)]
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)


# -- growth and full disks ------------------------------------------------------------------------
def fill_disk(path: str, out_path: str, fsize_limit: int = 0, chunk: int = 1 << 20) -> None:
    """Record until the disk (or the file-size limit) is full, then check nothing recorded was harmed.

    The training-loop side follows docs/reliability.md: when recording fails with JournalFullError,
    keep the generated value and go on without recording. Writes a JSON report to `out_path`.
    """
    import json
    import resource
    import signal as signals

    import torch

    from stepjournal import Journal
    from stepjournal.errors import JournalFullError
    from stepjournal.policies import Engine, parse

    if fsize_limit:
        signals.signal(signals.SIGXFSZ, signals.SIG_IGN)  # get EFBIG from write() instead of dying
        resource.setrlimit(resource.RLIMIT_FSIZE, (fsize_limit, fsize_limit))
    result: dict = {}
    generated_unrecorded = 0
    with Journal(path, run="full", map_size=64 * 1024) as journal:
        engine = Engine(journal, parse("dump"))
        recording, step, error = True, 0, None
        while step < 100_000 and generated_unrecorded < 5:
            step += 1
            value = {"step": step, "x": torch.full((chunk // 8,), step, dtype=torch.int64)}
            if not recording:
                generated_unrecorded += 1  # the loop goes on; the value is used, not journaled
                continue
            pending = engine.begin(step)
            try:
                engine.finish(pending, value)
            except JournalFullError as exc:
                error, recording = str(exc), False
                generated_unrecorded += 1
        result["error"] = error
        recorded = journal.recorded_steps(run="full")
        result["recorded"] = len(recorded)
        result["contiguous"] = recorded == list(range(1, len(recorded) + 1))
        result["intact"] = all(
            torch.equal(journal.load_output(journal.lookup(s))["x"], torch.full((chunk // 8,), s)) for s in recorded
        )
        result["verify_open"] = [p.kind for p in journal.verify()]
        result["unrecorded_calls"] = generated_unrecorded
    with Journal(path, readonly=True) as journal:
        result["verify_reopened"] = [p.kind for p in journal.verify()]
        result["recorded_reopened"] = len(journal.recorded_steps(run="full"))
    with open(out_path, "w", encoding="utf-8") as fh:
        json.dump(result, fh)


def main() -> None:  # pragma: no cover - `python tests/reliability_workers.py` is not a use
    sys.exit("this module holds process targets for the reliability tests")


if __name__ == "__main__":
    main()
