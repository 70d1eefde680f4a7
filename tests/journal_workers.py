"""Process targets of the journal-room tests (importable by spawned children)."""

from __future__ import annotations

import os
from typing import Any


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


# -- the payload races (tests/integration/test_payload_races.py) -----------------------------------
# Payloads from 64 KiB are files in these processes (8 MiB in use): the same code and races, fewer bytes.
SMALL_FILE_FROM = 1 << 16
# What `run_verb` exits with when the verb refused with a typed error (a traceback exits 1).
REFUSED = 3
VERBS = ("record", "prune", "retention", "compact", "pull", "import", "reindex", "remote add")


def small_files() -> None:
    """Payloads of `SMALL_FILE_FROM` bytes and more are files in the journals this process opens from now."""
    import stepjournal.payloads._payload_store as payload_store  # private: the store's internals

    payload_store.FILE_FROM = SMALL_FILE_FROM


def content(name: str) -> dict:
    """A payload of its own for each `name`, the same in every process, large enough to be a file."""
    import torch

    factor = int.from_bytes(name.encode(), "big") % 1_000_003 + 1
    return {"name": name, "ids": torch.arange(SMALL_FILE_FROM // 8 + 512, dtype=torch.int64) * factor}


def run_verb(verb: str, path: str, place: dict, tag: int, ack_path: str, progress: Any = None) -> None:
    """Run the writing `verb` on the journal at `path`, whole; append what it acknowledged to `ack_path`
    (``record <run> <step>``, ``remote <name>``, ``refused <error>``...). `place` names the remote and the
    bundle to pull from, and (``payload_store``) the URL a record, a retention and a prune keep payloads at,
    when not the journal's own files; `tag` makes this run's step and names its own; `progress`: a pull's
    and an import's. Exits `REFUSED` on a typed refusal."""
    from stepjournal import Journal
    from stepjournal.errors import StepJournalError
    from stepjournal.sharing import add_remote, import_bundle, pull
    from stepjournal.upkeep import Retention, compact, prune

    small_files()
    objects = place.get("payload_store")
    acked = []
    try:
        if verb == "record":  # the bytes a release of "base" step 0 lets go of, recorded anew
            with Journal(path, run="rec", payload_store=objects) as journal:
                journal.record(tag, content("X"))
            acked.append(f"record rec {tag}")
        elif verb == "retention":  # a new step of "base" releases the older ones in its own transaction
            keep = Retention(keep_last=1, run="base")
            with Journal(path, run="base", retention=keep, payload_store=objects) as journal:
                journal.record(100 + tag, content(f"R{tag}"))
            acked.append(f"record base {100 + tag}")
        elif verb == "prune":
            with Journal(path, session=False, payload_store=objects) as journal:
                prune(journal, Retention(keep_last=1))
        elif verb == "compact":
            compact(path)
        elif verb == "pull":
            pull(place["remote"], path, progress=progress)
            acked.append("pull")
        elif verb == "import":
            import_bundle(place["bundle"], path, progress=progress)
            acked.append("import")
        elif verb == "reindex":
            with Journal(path, session=False) as journal:
                journal.reindex()
        elif verb == "remote add":
            add_remote(path, f"r{tag}", place["remote"])
            acked.append(f"remote r{tag}")
        else:
            raise ValueError(verb)
    except StepJournalError as exc:
        acked.append(f"refused {type(exc).__name__}")
        _ack(ack_path, acked)
        raise SystemExit(REFUSED)
    _ack(ack_path, acked)


def _ack(ack_path: str, lines: list) -> None:
    with open(ack_path, "a", encoding="utf-8") as f:
        f.writelines(f"{line}\n" for line in lines)


def verb_in_lockstep(verb: str, path: str, place: dict, tag: int, ack_path: str, conn) -> None:
    """`run_verb` stopping at each observed point (a filesystem step in the journal's folder, the end of
    an LMDB write transaction, a pull's progress): its label ends in ``held`` where this process holds what another one's
    verb would wait for (a write transaction, compaction's lock, the remotes' lock)."""
    import re

    from kill_points import Lockstep

    class Points(Lockstep):
        def point(self, label: str) -> None:
            # The same in each run: a staged file's random name, a descriptor's number.
            label = re.sub(r"tmp/[0-9a-f]{32}", "tmp/<staged>", re.sub(r"fd:\d+", "fd", label))
            super().point(f"{label} held" if label != "lmdb committed" and _holding() else label)

    step = Points(conn)
    step.point("start")
    step.filesystem(path)(True)
    with step.lmdb_writes():
        try:
            run_verb(verb, path, place, tag, ack_path, step.progress)
        except SystemExit as exc:  # a refusal: said on the pipe's end, the parent reads the acks
            conn.close()
            raise SystemExit(exc.code) from None


def _holding() -> bool:
    """Whether this thread is inside a write transaction, compaction's exclusive lock or the remotes' lock."""
    import sys

    frame = sys._getframe(2)
    while frame is not None:
        code, names = frame.f_code, frame.f_locals
        if code.co_name == "write" and code.co_filename.endswith(os.path.join("storage", "_store.py")):
            return True
        if code.co_name == "compact" and code.co_filename.endswith("_compact.py") and "fd" in names:
            return True
        if code.co_name == "_changing" and "lock" in names:
            return True
        frame = frame.f_back
    return False


# -- many processes opening one new journal (tests/integration/test_open_while_creating.py) -----------
def open_new_journals(ctx, root: str, ranks: int, rounds: int) -> list:
    """`ranks` long-lived processes of `ctx` that, each round, open one new journal (``round-<n>`` in
    `root`) at once (a barrier) and record step n under ``rank-<r>``; return every failure they met."""
    barrier, results = ctx.Barrier(ranks), ctx.Queue()
    workers = [ctx.Process(target=_open_rounds, args=(root, rank, rounds, barrier, results)) for rank in range(ranks)]
    for worker in workers:
        worker.start()
    failures = []
    for _ in workers:
        failures.extend(results.get(timeout=600))
    for worker in workers:
        worker.join(60)
        if worker.exitcode != 0:
            failures.append(f"a worker exited with {worker.exitcode}")
    return failures


def _open_rounds(root: str, rank: int, rounds: int, barrier, results) -> None:
    from stepjournal import Journal

    failures = []
    try:
        for n in range(rounds):
            barrier.wait(timeout=300)
            try:
                with Journal(os.path.join(root, f"round-{n}"), run=f"rank-{rank}") as journal:
                    journal.record(n, {"rank": rank})
            except Exception as exc:  # every failure is the finding: keep going to count them all
                failures.append(f"round {n}, rank {rank}: {type(exc).__name__}: {exc}")
    finally:
        results.put(failures)
