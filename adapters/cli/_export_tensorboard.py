"""``stepjournal export JOURNAL --tensorboard DIR``: a run's sessions as TensorBoard event files, to see a recording
or a replay beside the live training curves.

One TensorBoard run per session, in ``DIR/RUN/s1-20261207-054100`` (the run key, the session's short name as
``runs`` and ``audit`` show it, the UTC time it opened), written by TensorBoard's own writer (PyTorch's
``SummaryWriter``, as TRL's and verl's TensorBoard loggers write theirs). Per train step, what the HTML report
charts (`_report.collect`, one session at a time): ``reward/mean``, ``reward/std``, ``response_length/mean``,
``samples/count``, ``time/STAGE`` (seconds), ``metrics/NAME`` (the ``metrics`` stage's numbers: TRL's loss and
reward, verl's actor values), ``calls/generated`` and ``calls/replayed`` (the session's calls at the step, every
stage), and where the step called tools ``tools/calls``, ``tools/replayed``, ``tools/misses``, ``tools/refused``,
``tools/tool_s`` and ``tools/saved_s`` (as ``audit --tools`` counts them); and the text ``samples``: the first
``--samples`` samples, decoded when a tokenizer is found, else their token ids. Each point's wall time is the
time the session journaled the step.
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import threading
import uuid
from typing import Any, Dict, List, Optional, Set, Tuple

from rich.console import Console
from rich.markup import escape

from stepjournal import Journal
from stepjournal.index import session_names
from stepjournal.vocabulary import Action

from ._common import choose_run
from ._progress import progress_bar
from ._render import Failure, cell, error_line, print_line
from ._report import choose_session, collect
from ._show_text import load_tokenizer

__all__ = ["run", "session_folder", "step_scalars", "samples_text", "PIP_INSTALL"]

PIP_INSTALL = "pip install tensorboard"
_WRITER_THREADS = "tensorboard.summary.writer.event_file_writer"  # the module of TensorBoard's writer thread
_ALWAYS_COUNTED = (Action.GENERATED, Action.REPLAYED)  # a curve for each, 0 where the session made none at the step


def session_folder(run: str, name: str, opened_ts: float) -> str:
    """The TensorBoard run a session is written to, relative to DIR: ``RUN/NAME-YYYYmmdd-HHMMSS`` (UTC), the run
    key made a folder name (what is not a letter, digit, ``.``, ``_`` or ``-`` becomes ``_``)."""
    folder = re.sub(r"[^A-Za-z0-9._-]", "_", run)[:100].strip(".") or "_"
    when = datetime.datetime.fromtimestamp(opened_ts, datetime.timezone.utc).strftime("%Y%m%d-%H%M%S")
    return os.path.join(folder, f"{name}-{when}")


def step_scalars(entry: Dict[str, Any]) -> Dict[str, float]:
    """A step's scalars, tag -> value, from one `collect` entry (a value the step has none of is left out)."""
    out: Dict[str, float] = {}
    if entry["mean"] is not None:
        out["reward/mean"], out["reward/std"] = entry["mean"], entry["std"]
    if entry["length"] is not None:
        out["response_length/mean"] = entry["length"]
    if entry["action"] is not None:
        out["samples/count"] = float(entry["count"])
    for stage, seconds in entry["durations"].items():
        out[f"time/{stage}"] = seconds
    for name, value in entry["metrics"].items():
        if value is not None:
            out[f"metrics/{name}"] = value
    for action in sorted({*_ALWAYS_COUNTED, *entry["calls"]}):
        out[f"calls/{action}"] = float(entry["calls"].get(action, 0))
    if entry["tools"] is not None:
        for name, value in entry["tools"].items():
            out[f"tools/{name}"] = float(value)
    return out


def samples_text(entry: Dict[str, Any]) -> Optional[str]:
    """A step's text summary (TensorBoard renders it as Markdown): a line per sample, then its prompt and
    response (or token ids) as a code block, so nothing in them is read as Markdown."""
    parts: List[str] = []
    served = f"replayed from step {entry['source_step']}" if entry["action"] == Action.REPLAYED else entry["action"]
    for s in entry["samples"]:
        facts = [f"{s['length']} tokens" + (" (truncated)" if s["truncated"] else "")]
        facts += [f"{stage} {value:g}" for stage, value in s["rewards"].items() if value is not None]
        parts.append(f"**sample {s['index']}** · {' · '.join(facts)} · {served}")
        if s["prompt"] is None and s["response"] is None and "response_ids" in s:
            lines = [f"prompt ids:   {s['prompt_ids']}", f"response ids: {s['response_ids']}"]
        else:
            lines = [f"prompt:   {s['prompt'] or ''}", f"response: {s['response'] or ''}"]
        parts.append("\n".join("    " + line for text in lines for line in text.splitlines() or [""]))
    return "\n\n".join(parts) if parts else None


def _tokenizer(journal: Journal, run: str, args: argparse.Namespace, err: Console) -> Any:
    """The run's tokenizer, or None: the samples are then token ids, and one line says how to get text. A
    ``--tokenizer`` that does not load is an error."""
    if args.no_text:
        return None
    return load_tokenizer(journal, run, args.tokenizer, lambda line: print_line(err, escape(line)))


def _check_folder(top: str, folder: str) -> None:
    """Refuses `folder` (under `top`) when it holds event files (TensorBoard would show both), or when it or a
    folder between it and `top` is a link or something else than a folder (a file, a FIFO)."""
    part = top
    for name in os.path.relpath(folder, top).split(os.sep):
        part = os.path.join(part, name)
        if os.path.islink(part):  # a link below DIR would lead the files out of it (DIR itself may be one)
            raise Failure(f"{cell(part)} is a link (to {cell(os.readlink(part))}): the export writes only inside "
                          "--tensorboard's folder; remove it, or export into another folder")
        if os.path.lexists(part) and not os.path.isdir(part):
            raise Failure(f"{cell(part)} is not a folder: remove it, or export into another folder")
    if os.path.isdir(folder) and _event_files(folder):
        raise Failure(f"{cell(folder)} already holds event files (TensorBoard would show both): "
                      "export into another folder, or remove them")


def _event_files(folder: str) -> List[str]:
    return [f for f in os.listdir(folder) if f.startswith("events.out.tfevents")]


def _remove_events(folder: str, suffix: str) -> None:
    """Removes the event file of a session whose writing failed (the one whose name ends in this export's
    `suffix`), and the folder when that leaves it empty."""
    try:
        for name in _event_files(folder):
            if name.endswith(suffix):
                os.remove(os.path.join(folder, name))
        os.rmdir(folder)
    except OSError:  # a folder that holds other things, or is gone
        pass


def _write_session(writer_class: Any, folder: str, steps: List[Dict[str, Any]], suffix: str) -> None:
    """Writes one session's steps into `folder` with TensorBoard's writer, into an event file whose name ends in
    `suffix`. Its writes happen in a thread of its own, whose error (a full disk) is raised here: by its next
    write, or by the flush before closing. Raises Failure when another export wrote the folder meanwhile."""
    before = threading.excepthook

    def quiet(hook_args: Any) -> None:  # the writer's thread failed: its error is raised here, not printed there
        if type(hook_args.thread).__module__ != _WRITER_THREADS:
            before(hook_args)

    threading.excepthook = quiet
    writer = writer_class(log_dir=folder, filename_suffix=suffix)  # the file exists once it returns
    try:
        # Another export that checked the folder before this one's file existed: of two, the later one leaves.
        if any(not name.endswith(suffix) for name in _event_files(folder)):
            raise Failure(f"{cell(folder)} got event files from another export while this one began writing it "
                          "(TensorBoard would show both): this one left it; see what the other wrote")
        for entry in steps:
            for tag, value in step_scalars(entry).items():
                writer.add_scalar(tag, value, entry["step"], walltime=entry["ts"])
            text = samples_text(entry)
            if text is not None:
                writer.add_text("samples", text, entry["step"], walltime=entry["ts"])
        writer.flush()  # close() alone would not raise the writer thread's error: the file would end silently
    finally:
        try:
            writer.close()
        finally:
            threading.excepthook = before


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Write each session's event files; refuses a session folder that already holds some (TensorBoard would
    show both)."""
    try:
        import tensorboard  # noqa: F401  (PyTorch's writer needs it, and says so less plainly)
    except ImportError:
        raise Failure(f"export --tensorboard needs TensorBoard: {PIP_INSTALL}") from None
    if os.path.lexists(args.tensorboard) and not os.path.isdir(args.tensorboard):  # a file, a FIFO, a dead link
        raise Failure(f"--tensorboard {cell(args.tensorboard)} is not a folder: name a new folder, or the log folder "
                      "your trainer writes TensorBoard files into")
    from torch.utils.tensorboard import SummaryWriter

    written: List[Tuple[str, int]] = []
    with Journal(args.journal, readonly=True) as journal:
        given_run = args.run[0] if args.run else None
        if args.session is not None:  # the session names its run ("", a script's unset variable, names none)
            session, _, run_key = choose_session(journal, given_run, args.session)
            chosen: Optional[Set[str]] = {session}
        else:
            run_key, chosen = choose_run(journal, given_run), None
        opened = [event for _, event in journal.sessions()]
        names = session_names(event.session for event in opened)
        folders = {e.session: os.path.join(args.tensorboard, session_folder(run_key, names[e.session], e.ts))
                   for e in opened if e.run == run_key and (chosen is None or e.session in chosen)}
        for folder in folders.values():  # all checked before anything is written
            _check_folder(args.tensorboard, folder)
        tokenizer = _tokenizer(journal, run_key, args, err)
        with progress_bar(err) as progress:
            task = progress.add_task("sessions", total=len(folders))
            for session, folder in folders.items():
                data = collect(journal, run_key, tokenizer, per_step=args.samples, chars=args.chars, session=session,
                               ids=tokenizer is None)
                progress.update(task, advance=1)
                if not data["steps"]:
                    continue  # a session that made no train call
                suffix = f".stepjournal-{uuid.uuid4().hex[:12]}"  # names this export's event file
                try:
                    _write_session(SummaryWriter, folder, data["steps"], suffix)
                except (OSError, KeyboardInterrupt, Failure) as exc:
                    _remove_events(folder, suffix)  # a half-written session is not kept: an export writes it whole
                    for done, steps in written:
                        print_line(out, f"wrote {cell(done)} ({steps} steps)")
                    if not isinstance(exc, OSError):
                        raise
                    raise Failure(f"writing {cell(folder)}: {error_line(exc)}; nothing of this session was kept "
                                  "(export it again, with --session, once the cause is fixed)") from None
                written.append((folder, len(data["steps"])))
    if not written:
        raise Failure(f"run {cell(run_key)} has no train calls: nothing to export")
    for folder, steps in written:
        print_line(out, f"wrote {cell(folder)} ({steps} steps)")
    print_line(out, f"see them with: tensorboard --logdir {cell(args.tensorboard)}")
    return 0
