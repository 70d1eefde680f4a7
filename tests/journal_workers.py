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
