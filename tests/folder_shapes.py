"""The folder-shapes fuzz's worker: a link, a FIFO, a file or a folder at each path a journal owns, then verbs.

`run_cases` is a process target (spawn or forkserver). Each case copies a template journal (a payload
file, a leftover in ``payloads/tmp/``, ``remotes.json``, a writer lock), puts one or two shapes at its
owned paths (`PATHS`, `SHAPES`: a link to a folder or a file of a sentinel folder beside the journal,
a dangling link, a FIFO, a plain file, a folder, a hard link to the sentinel's file), runs verbs
in-process (`VERBS`) and checks that each ended in a result or a one-line `StepJournalError`, and that
the sentinel folder (names, kinds, contents, mtimes) and the folder holding both are as they were.
An ``alarm`` with its default action is armed per case: a verb that hangs (a FIFO opened blocking)
kills the worker, and the parent reads the case from ``<out>.case``. A case is built from its number
alone (`make_case`), so a failure is rebuilt by running that case again.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import stat
import traceback
from typing import Any, Callable, Dict, List, Tuple

PER_CASE_S = 60  # a hang detector only: a case takes milliseconds
RUN = "fuzz"
PATHS = ("payloads", "payloads/tmp", "payloads/FAN", "payloads/FAN/FILE", "remotes.json",
         ".remotes.json.PID.tmp", "LOCK", "lock.mdb")
SHAPES = ("link_folder", "link_file", "dangling", "fifo", "file", "folder", "hard_link")
VERBS = ("record", "read", "verify", "compact", "compact_to", "prune", "remote_add", "remote_list")


def big(step: int) -> Dict[str, Any]:
    import torch

    return {"ids": torch.arange(2048) + step}  # 16 KiB: a payload file (the worker's FILE_FROM is 4 KiB)


def make_case(number: int) -> Tuple[List[Tuple[str, str]], List[str]]:
    """Case `number`: its shapes ((owned path, shape), ...) and its verbs. The first cases are every
    single shape with every single verb; the rest draw two shapes and two to four verbs."""
    singles = [(p, s, v) for p in PATHS for s in SHAPES for v in VERBS]
    if number < len(singles):
        path, shape, verb = singles[number]
        return [(path, shape)], [verb]
    rng = random.Random(number)
    paths = rng.sample(PATHS, 2)
    return [(p, rng.choice(SHAPES)) for p in paths], [rng.choice(VERBS) for _ in range(rng.randint(2, 4))]


def build_template(folder: str) -> str:
    """A journal with a payload file (step 1), a small payload (step 2), a remote, a leftover in
    ``payloads/tmp/`` and its run's writer lock."""
    import torch
    from stepjournal import Journal
    from stepjournal.sharing import add_remote

    path = os.path.join(folder, "template")
    with Journal(path, run=RUN, sync=False) as journal:
        journal.record(1, big(1))
        journal.record(2, {"ids": torch.arange(4)})
    add_remote(path, "origin", "file:///nowhere/remote")
    with open(os.path.join(path, "payloads", "tmp", "left-by-a-crash"), "wb") as f:
        f.write(b"half")
    return path


def _owned_path(template: str, journal: str, path: str) -> str:
    """`path` of `PATHS` in `journal` (a copy of `template`): FAN, FILE, PID and LOCK filled in."""
    from stepjournal.base._paths import writer_lock_name  # private: the lock file's name

    payloads = os.path.join(template, "payloads")
    # All 256 two-digit folders are made with the first file: the one that holds it.
    fan = next(n for n in sorted(os.listdir(payloads)) if n != "tmp" and os.listdir(os.path.join(payloads, n)))
    name = os.listdir(os.path.join(template, "payloads", fan))[0]
    path = path.replace("FAN", fan).replace("FILE", name).replace("PID", str(os.getpid()))
    return os.path.join(journal, writer_lock_name(RUN) if path == "LOCK" else path)


def _plant(target: str, shape: str, sentinel: str) -> None:
    """Put `shape` at `target` (whatever was there removed first)."""
    if os.path.isdir(target) and not os.path.islink(target):
        shutil.rmtree(target)
    elif os.path.lexists(target):
        os.unlink(target)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if shape == "link_folder":
        os.symlink(os.path.join(sentinel, "folder"), target)
    elif shape == "link_file":
        os.symlink(os.path.join(sentinel, "file"), target)
    elif shape == "dangling":
        os.symlink(os.path.join(sentinel, "missing"), target)
    elif shape == "fifo":
        os.mkfifo(target)
    elif shape == "file":
        with open(target, "wb") as f:
            f.write(b"not what the journal put here")
    elif shape == "folder":
        os.mkdir(target)
        with open(os.path.join(target, "0" * 62), "wb") as f:
            f.write(b"a file in a folder")
    else:
        os.link(os.path.join(sentinel, "file"), target)


def _sentinel(folder: str) -> str:
    """A folder outside the journal, holding what the links point to, with names a journal might use."""
    os.makedirs(os.path.join(folder, "folder", "ab"))
    for name in ("file", "folder/left-by-a-crash", "folder/remotes.json", "folder/ab/" + "c" * 62,
                 "folder/" + "0" * 62):
        with open(os.path.join(folder, name), "wb") as f:
            f.write(name.encode() * 3)
    return folder


def snapshot(folder: str) -> Dict[str, Tuple[Any, ...]]:
    """Every name under `folder` (links not followed): its kind, size, mtime and content digest or target."""
    found: Dict[str, Tuple[Any, ...]] = {}
    for here, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(here, name)
            st = os.lstat(path)
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    what: Any = hashlib.sha256(f.read()).hexdigest()
            else:
                what = os.readlink(path) if stat.S_ISLNK(st.st_mode) else None
            found[os.path.relpath(path, folder)] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns, what)
    return found


def _verbs(journal: str, root: str) -> Dict[str, Callable[[], Any]]:
    import torch
    from stepjournal import Journal
    from stepjournal.sharing import add_remote, list_remotes
    from stepjournal.upkeep import Retention, compact, prune

    def record() -> None:
        with Journal(journal, run=RUN, sync=False) as j:
            j.record(3, big(3))
            j.record(4, {"ids": torch.arange(3)})

    def read() -> None:
        with Journal(journal, run=RUN, readonly=True) as j:
            for step in j.recorded_steps():
                j.load_output(j.lookup(step))

    def verify() -> List[str]:
        with Journal(journal, readonly=True) as j:
            return [p.kind for p in j.verify()]

    def do_prune() -> None:
        with Journal(journal, run=RUN, sync=False) as j:
            prune(j, Retention(keep_last=1))

    def compact_to() -> None:
        compact(journal, to=os.path.join(root, f"copy-{len(os.listdir(root))}"))

    return {"record": record, "read": read, "verify": verify, "compact": lambda: compact(journal),
            "compact_to": compact_to, "prune": do_prune,
            "remote_add": lambda: add_remote(journal, f"r{len(os.listdir(journal))}", "file:///nowhere/other"),
            "remote_list": lambda: list_remotes(journal)}


def run_case(template: str, number: int, folder: str) -> Dict[str, Any]:
    """Case `number` in a fresh `folder`: what each verb ended in, and what it must not have done."""
    from stepjournal.errors import StepJournalError

    shapes, verbs = make_case(number)
    os.makedirs(folder)
    journal = os.path.join(folder, "journal")
    shutil.copytree(template, journal, symlinks=True)
    sentinel = _sentinel(os.path.join(folder, "sentinel"))
    for path, shape in sorted(shapes, key=lambda planted: -planted[0].count("/")):  # a folder's content first
        _plant(_owned_path(template, journal, path), shape, sentinel)
    before, around = snapshot(sentinel), set(os.listdir(folder))
    ended: List[str] = []
    failure = None
    runs = _verbs(journal, folder)
    for verb in verbs:
        try:
            runs[verb]()
            ended.append(f"{verb}:ok")
        except StepJournalError as exc:
            if "\n" in str(exc):
                failure = f"{verb}: a message of several lines: {exc!r}"
            ended.append(f"{verb}:{type(exc).__name__}")
        except Exception:  # anything else is the defect this fuzz looks for
            failure = f"{verb}: {traceback.format_exc()}"
        if failure:
            break
    if failure is None and snapshot(sentinel) != before:
        failure = f"the sentinel folder outside the journal changed: {sorted(set(snapshot(sentinel).items()) ^ set(before.items()))}"
    if failure is None and {n for n in os.listdir(folder) if not n.startswith("copy-")} != around:
        failure = f"the folder holding the journal changed: {sorted(os.listdir(folder))}"
    return {"case": number, "shapes": shapes, "verbs": verbs, "ended": ended, "failure": failure}


def run_cases(start: int, stop: int, folder: str, out: str) -> None:
    """Cases `start` to `stop` - 1 (see the module's doc); their counts and failures written to `out` as JSON."""
    import stepjournal.payloads._payload_store as payload_store  # private: the store's internals

    # Payload files from 4 KiB, as the file-threshold bench sets it: each case's files are small.
    payload_store.FILE_FROM = 4096
    os.environ["XDG_CONFIG_HOME"] = os.path.join(folder, "config")  # your own remotes: none, and not the user's
    template = build_template(folder)
    template_before = snapshot(template)
    counts: Dict[str, int] = {}
    failures: List[Dict[str, Any]] = []
    for number in range(start, stop):
        with open(out + ".case", "w", encoding="ascii") as fh:
            fh.write(str(number))
        signal.alarm(PER_CASE_S)
        result = run_case(template, number, os.path.join(folder, f"case-{number}"))
        signal.alarm(0)
        for outcome in result["ended"]:
            counts[outcome] = counts.get(outcome, 0) + 1
        if result["failure"]:
            failures.append(result)
        else:
            shutil.rmtree(os.path.join(folder, f"case-{number}"))
        if len(failures) >= 20:
            break
    if snapshot(template) != template_before:
        failures.append({"case": None, "failure": "the template journal changed"})
    with open(out, "w", encoding="utf-8") as fh:
        json.dump({"cases": number + 1 - start, "counts": counts, "failures": failures}, fh)
