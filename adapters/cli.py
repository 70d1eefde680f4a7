"""The `stepjournal` command line: look into a journal, check it, export it, draw it, rebuild its index.

Every command but `reindex` opens the journal read-only: it changes no byte of the journal's data,
works while a trainer is writing to it, and works on a copy in a read-only place. Tables and progress
go through rich (progress on stderr); ``--json`` and ``--csv`` print plain machine-readable text.
Errors print one line, ``stepjournal: error: ...``: exit status 2 for bad arguments, 1 for failures.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import functools
import json
import logging
import math
import os
import sys
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch
from rich.console import Console
from rich.filesize import decimal as human_size
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.tree import Tree

import stepjournal
from stepjournal import (
    AUDIT_SCHEMA_VERSION,
    AuditRecord,
    CodecRegistry,
    GenerationRecorded,
    IntegrityError,
    Journal,
    PayloadRef,
    ReplayServed,
    StepJournalError,
    describe_payload,
    summarize_runs,
)
from stepjournal._audit import ACTIONS, AUDIT_FIELDS, iso_time
from stepjournal._keys import parse_gen_key
from stepjournal._log import console_logging
from stepjournal.policies import StepRanges

__all__ = ["main", "EXPORT_FORMAT_VERSION"]

EXPORT_FORMAT_VERSION = 1
_PREVIEW_VALUES = 6
_ACTION_STYLE = {"generated": "green", "replayed": "blue", "bypassed": "bright_black", "refused": "red"}


class _UsageError(Exception):
    """Bad arguments: exit status 2."""


class _Failure(Exception):
    """The command could not do its work: exit status 1."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr, not a usage dump and a SystemExit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(f"{message} (see `{self.prog} --help`)")


# -- helpers -----------------------------------------------------------------------------------------
def _open(path: str) -> Journal:
    return Journal(path, readonly=True)


def _steps(text: Optional[str]) -> Optional[StepRanges]:
    if text is None:
        return None
    try:
        return StepRanges.parse(text)
    except StepJournalError as exc:
        # The parser draws a caret under the bad character on later lines; one line is enough here.
        raise _UsageError(f"--steps: {str(exc).splitlines()[0]}") from None


def _compact_steps(steps: Sequence[int]) -> str:
    """1,2,3,5,7,8 -> '1-3,5,7-8'."""
    out: List[str] = []
    for step in sorted(set(steps)):
        if out and "-" not in out[-1].split(",")[-1] and int(out[-1]) == step - 1:
            out[-1] = f"{out[-1]}-{step}"
        elif out and "-" in out[-1] and int(out[-1].split("-")[1]) == step - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{step}"
        else:
            out.append(str(step))
    return ",".join(out)


def _runs_with_calls(journal: Journal) -> List[str]:
    return [s.run for s in summarize_runs(journal) if s.calls]


def _one_run(journal: Journal, run: Optional[str]) -> str:
    """The run a command is about: `run` when given (it must exist), else the journal's only run."""
    runs = _runs_with_calls(journal)
    if run is not None:
        if run not in runs:
            raise _Failure(f"run {run!r} has no calls in {journal.path}; its runs are: {', '.join(runs) or 'none'}")
        return run
    if not runs:
        raise _Failure(f"journal {journal.path} holds no generate calls")
    if len(runs) > 1:
        raise _Failure(f"journal {journal.path} holds several runs ({', '.join(runs)}); choose one with --run")
    return runs[0]


def _progress(err: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err,
    )


def _one_line(message: object) -> str:
    return " ".join(line.strip() for line in str(message).splitlines() if line.strip())


def _print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False) + "\n")


class _Custom:
    """A value of a custom type, as its codec stored it: the codec's own code is never run here.

    The CLI needs no codec registered (and imports nothing of the user's) to show or export a payload:
    what a codec stores is made of ordinary values (dicts, tensors, arrays), and those are shown.
    """

    __slots__ = ("name", "value")

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value


def _refuse_encode(value: Any) -> Any:
    raise TypeError("the CLI only reads payloads")


def _ext_names(node: Any, found: set) -> None:
    if isinstance(node, dict):
        if node.get("kind") == "ext":
            found.add(node["name"])
        for child in node.values():
            _ext_names(child, found)
    elif isinstance(node, list):
        for child in node:
            _ext_names(child, found)


class _Reader:
    """A read-only journal whose loads turn each custom-type value into a `_Custom`."""

    def __init__(self, path: str) -> None:
        self.registry = CodecRegistry()
        self.journal = Journal(path, readonly=True, registry=self.registry)

    def __enter__(self) -> "_Reader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.journal.close()

    def load(self, ref: PayloadRef, step: int) -> Any:
        """Load a payload, its digest checked."""
        return _load(self.journal, self.registry, ref, step)


def _load(journal: Journal, registry: CodecRegistry, ref: PayloadRef, step: int) -> Any:
    names: set = set()
    _ext_names(describe_payload(journal.payload_bytes(ref.digest), max_items=None), names)
    for name in sorted(names):
        if name not in registry:
            holder = type(f"Custom[{name}]", (_Custom,), {"__slots__": ()})
            registry.register(holder, name, encode=_refuse_encode, decode=functools.partial(_Custom, name))
    return journal.load(ref, step=step)


# -- runs --------------------------------------------------------------------------------------------
def cmd_runs(args: argparse.Namespace, out: Console, err: Console) -> int:
    with _open(args.journal) as journal:
        summaries = summarize_runs(journal)
    if args.json:
        _print_json([s.to_json() for s in summaries])
        return 0
    if not summaries:
        out.print(f"journal {escape(args.journal)} is empty")
        return 0
    runs = Table(title=f"runs in {escape(args.journal)}", title_justify="left")
    for column in ("run", "sessions", "calls", *ACTIONS, "steps", "stored", "fingerprint"):
        runs.add_column(column, justify="right" if column in ("sessions", "calls", *ACTIONS, "stored") else "left")
    for s in summaries:
        fingerprints = s.fingerprints()
        shown = _fingerprint_text(fingerprints[-1]) if fingerprints else "-"
        if len(fingerprints) > 1:
            shown += f" [yellow](+{len(fingerprints) - 1} other)[/]"
        steps = "-" if s.first_step is None else f"{s.first_step}-{s.last_step}"
        runs.add_row(
            escape(s.run),
            str(len(s.sessions)),
            str(s.calls),
            *(str(s.counts[a]) for a in ACTIONS),
            steps,
            human_size(s.stored_bytes),
            shown,
        )
    out.print(runs)
    sessions = Table(title="sessions", title_justify="left")
    for column in ("#", "run", "session", "opened (UTC)", "host", "pid", "version", "fingerprint"):
        sessions.add_column(column)
    for s in summaries:
        for seq, session in s.sessions:
            sessions.add_row(
                str(seq),
                escape(s.run),
                session.session[:12],
                _short_time(session.ts),
                escape(session.host),
                str(session.pid),
                session.library_version,
                _fingerprint_text(session.fingerprint),
            )
    out.print(sessions)
    return 0


def _fingerprint_text(fp: Dict[str, Any]) -> str:
    if not fp:
        return "{}"
    return escape(", ".join(f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in sorted(fp.items())))


def _short_time(ts: Optional[float]) -> str:
    text = iso_time(ts)
    return "-" if text is None else text.replace("T", " ")[:19]


# -- audit -------------------------------------------------------------------------------------------
def cmd_audit(args: argparse.Namespace, out: Console, err: Console) -> int:
    steps = _steps(args.steps)
    with _open(args.journal) as journal:
        records = journal.audit(run=args.run, steps=steps, mode=args.mode, actions=args.action or None)
    if args.json:
        _print_json([r.to_json() for r in records])
    elif args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(AUDIT_FIELDS)
        for r in records:
            row = r.to_json()
            writer.writerow([_csv_cell(row[k]) for k in AUDIT_FIELDS])
    else:
        out.print(_audit_table(args.journal, records))
    return 0


def _csv_cell(value: Any) -> Any:
    """Empty for None, JSON spelling for booleans (true/false), the value otherwise."""
    if value is None:
        return ""
    return json.dumps(value) if isinstance(value, bool) else value


def _audit_table(path: str, records: Sequence[AuditRecord]) -> Table:
    table = Table(title=f"generate calls in {escape(path)} ({len(records)})", title_justify="left")
    columns = ("#", "session", "run", "mode", "step", "idx", "action", "stored", "source", "policy", "reason",
               "size", "digest", "time (UTC)")
    for column in columns:
        table.add_column(column, justify="right" if column in ("#", "step", "idx", "size") else "left",
                         overflow="fold")
    for r in records:
        source = f"{r.source_step}#{r.source_gen_index}" if r.action == "replayed" else ""
        if source and r.source_run != r.run:
            source += f" ({r.source_run})"
        style = _ACTION_STYLE[r.action]
        table.add_row(
            str(r.seq),
            r.session[:8],
            escape(r.run),
            escape(r.mode),
            str(r.step),
            str(r.gen_index),
            f"[{style}]{r.action}[/]",
            "yes" if r.stored else "no",
            escape(source),
            escape(r.policy),
            escape(r.reason),
            human_size(r.nbytes) if r.nbytes is not None else "",
            (r.digest or "")[:12],
            _short_time(r.ts),
        )
    return table


# -- show --------------------------------------------------------------------------------------------
def _find_call(journal: Journal, run: str, mode: str, step: int, index: int) -> Tuple[int, Any]:
    """The call whose payload `show` displays: the latest recorded output there, else the latest call."""
    recorded = journal.lookup(step, index, mode=mode, run=run)
    if recorded is not None:
        return recorded.seq, recorded.event
    latest = None
    for seq, event in journal.events(run=run, steps={step}):
        if (event.mode, event.gen_index) == (mode, index):
            latest = (seq, event)
    if latest is None:
        indices = journal.recorded_indices(step, mode=mode, run=run)
        if indices:
            raise _Failure(f"step {step} of run {run!r} ({mode}) has no call #{index}; it has {indices}")
        recorded_steps = journal.recorded_steps(mode=mode, run=run)
        raise _Failure(
            f"run {run!r} has no {mode} call at step {step}; recorded steps: "
            f"{_compact_steps(recorded_steps) or 'none'}"
        )
    return latest


def _preview(value: Any) -> Optional[List[Any]]:
    """The first few values of a tensor or array, as JSON-able Python numbers (None when not numeric)."""
    try:
        if isinstance(value, torch.Tensor):
            flat = value.reshape(-1)[:_PREVIEW_VALUES]
            if flat.dtype.is_complex:
                return [str(v) for v in flat.tolist()]
            if flat.dtype.is_floating_point and flat.dtype not in (torch.float32, torch.float64):
                flat = flat.to(torch.float32)
            items = flat.tolist()
        elif isinstance(value, np.ndarray):
            items = value.reshape(-1)[:_PREVIEW_VALUES].tolist()
        else:
            return None
    except (RuntimeError, TypeError, ValueError):
        return None  # dtypes without arithmetic (bits8, uint4 ...) have no values to show
    out = []
    for item in items:
        if isinstance(item, float):
            out.append(round(item, 6) if math.isfinite(item) else repr(item))
        elif isinstance(item, (bool, int, str)):
            out.append(item)
        else:
            out.append(str(item))
    return out


def _annotate(node: Dict[str, Any], value: Any) -> None:
    """Add a "preview" of the first values to every tensor and array node of a `describe_payload` tree."""
    kind = node.get("kind")
    if kind in ("tensor", "ndarray"):
        preview = _preview(value)
        if preview is not None:
            node["preview"] = preview
    elif kind in ("list", "tuple") and isinstance(value, (list, tuple)):
        for child, item in zip(node["items"], value):
            _annotate(child, item)
    elif kind == "dict" and isinstance(value, dict):
        for child, item in zip(node["items"], value.values()):
            _annotate(child["value"], item)
    elif kind == "object_array" and isinstance(value, np.ndarray):
        for child, item in zip(node["items"], value.flat):
            _annotate(child, item)
    elif kind == "ext" and isinstance(value, _Custom):
        _annotate(node["value"], value.value)


def _node_text(node: Dict[str, Any]) -> str:
    kind = node["kind"]
    if kind in ("tensor", "ndarray"):
        text = f"[cyan]{kind}[/] {escape(node['dtype'])} {node['shape']} {human_size(node['nbytes'])}"
        if "preview" in node:
            more = ", …" if node["nbytes"] and len(node["preview"]) == _PREVIEW_VALUES else ""
            text += f"  [dim]{escape(', '.join(str(v) for v in node['preview']))}{more}[/]"
        return text
    if kind in ("list", "tuple", "dict"):
        return f"[cyan]{kind}[/] ({node['length']} {'keys' if kind == 'dict' else 'items'})"
    if kind == "object_array":
        return f"[cyan]object array[/] {node['shape']}"
    if kind == "str":
        return f"[cyan]str[/] {escape(repr(node['value']))}" + (
            f" [dim]({node['length']} chars)[/]" if node["length"] > len(node["value"]) else ""
        )
    if kind == "bytes":
        return f"[cyan]bytes[/] {human_size(node['nbytes'])}"
    if kind == "none":
        return "[cyan]None[/]"
    if kind == "ext":
        return f"[cyan]custom[/] {escape(node['name'])} [dim](as its codec stored it)[/]"
    return f"[cyan]{kind}[/] {escape(str(node.get('value')))}"


def _tree(node: Dict[str, Any], tree: Tree) -> None:
    kind = node["kind"]
    if kind == "dict":
        for item in node["items"]:
            child = tree.add(f"[bold]{escape(item['key'])}[/]: {_node_text(item['value'])}")
            _tree(item["value"], child)
    elif kind in ("list", "tuple", "object_array"):
        for i, item in enumerate(node["items"]):
            child = tree.add(f"[bold]{i}[/]: {_node_text(item)}")
            _tree(item, child)
    elif kind == "ext":
        _tree(node["value"], tree.add(_node_text(node["value"])))
        return
    else:
        return
    total = node.get("length", len(node["items"]))
    if total > len(node["items"]):
        tree.add(f"[dim]… {total - len(node['items'])} more[/]")


def cmd_show(args: argparse.Namespace, out: Console, err: Console) -> int:
    with _Reader(args.journal) as reader:
        journal = reader.journal
        run = _one_run(journal, args.run)
        seq, event = _find_call(journal, run, args.mode, args.step, args.index)
        ref: Optional[PayloadRef]
        if isinstance(event, GenerationRecorded):
            ref = event.input if args.input else event.output
        elif isinstance(event, ReplayServed) and not args.input:
            ref = event.output
        else:
            ref = None
        record = AuditRecord.from_event(seq, event)
        what = "input" if args.input else "output"
        if ref is None:
            raise _Failure(
                f"step {args.step} call #{args.index} of run {run!r} ({args.mode}) was {record.action} "
                f"(event #{seq}) and has no stored {what}"
            )
        structure = describe_payload(journal.payload_bytes(ref.digest), max_items=args.items)
        _annotate(structure, reader.load(ref, args.step))
    header = record.to_json()
    header.pop("schema_version")
    if args.json:
        _print_json({"schema_version": AUDIT_SCHEMA_VERSION, "call": header, "payload": what,
                     "digest": ref.digest, "nbytes": ref.nbytes, "structure": structure})
        return 0
    title = f"run {escape(run)} · {escape(args.mode)} · step {args.step} · call #{args.index} · event #{seq}"
    out.print(f"[bold]{title}[/]")
    line = f"[{_ACTION_STYLE[record.action]}]{record.action}[/]"
    if record.action == "replayed":
        line += f" from step {record.source_step} call #{record.source_gen_index} (event #{record.source_seq})"
    out.print(f"{line} by policy {escape(record.policy)}: {escape(record.reason)}, at {_short_time(record.ts)} UTC")
    out.print(f"{what} {ref.digest} · {human_size(ref.nbytes)}"
              + (f" ({human_size(ref.stored_nbytes)} stored, {ref.compression})" if ref.compression else ""))
    root = Tree(_node_text(structure))
    _tree(structure, root)
    out.print(root)
    return 0


# -- verify ------------------------------------------------------------------------------------------
def cmd_verify(args: argparse.Namespace, out: Console, err: Console) -> int:
    with _open(args.journal) as journal, _progress(err) as progress:
        task = progress.add_task("verifying", total=None)
        problems = journal.verify(progress=lambda done, total: progress.update(task, completed=done, total=total))
        events = journal.last_seq()
    steps = sorted({s for p in problems for s in p.steps})
    if args.json:
        _print_json({
            "schema_version": AUDIT_SCHEMA_VERSION,
            "ok": not problems,
            "events": events,
            "affected_steps": steps,
            "problems": [{"kind": p.kind, "where": p.where, "steps": list(p.steps), "detail": p.detail}
                         for p in problems],
        })
        return 1 if problems else 0
    if not problems:
        out.print(f"[green]journal is whole[/]: {events} events decode, every payload matches its digest, "
                  "the index matches the event log")
        return 0
    table = Table(title=f"{len(problems)} problem{'s' * (len(problems) != 1)} in {escape(args.journal)}",
                  title_justify="left")
    for column in ("kind", "where", "steps", "detail"):
        table.add_column(column, overflow="fold")
    for p in problems:
        table.add_row(p.kind, escape(_where_text(p)), _compact_steps(p.steps) or "?", escape(p.detail))
    out.print(table)
    out.print(f"[red]journal is damaged[/]; affected steps: {_compact_steps(steps) or 'unknown'}")
    return 1


def _where_text(problem: Any) -> str:
    """An index key (``run \\0 mode \\0 step gen_index``, hex) as words; other places as they are."""
    if problem.kind == "index":
        key = parse_gen_key(bytes.fromhex(problem.where))
        if key is not None:
            return f"run {key.run} {key.mode} step {key.step} #{key.gen_index}"
    if problem.kind in ("payload", "missing_payload"):
        return problem.where[:16] + "…"
    return problem.where


# -- export ------------------------------------------------------------------------------------------
_SAFETENSORS_OK: Dict[torch.dtype, bool] = {}


def _safetensors_takes(dtype: torch.dtype) -> bool:
    found = _SAFETENSORS_OK.get(dtype)
    if found is None:
        from safetensors.torch import save

        try:
            save({"probe": torch.zeros(1, dtype=dtype)})
            found = True
        except Exception:  # safetensors raises KeyError, ValueError or TypeError for dtypes it lacks
            found = False
        _SAFETENSORS_OK[dtype] = found
    return found


class _Flattener:
    """Split a decoded payload into tensors (by dotted path) and a JSON tree with placeholders."""

    def __init__(self, folder: str, tensors_file: str, raw_dir: str) -> None:
        self.folder = folder
        self.tensors_file = tensors_file
        self.raw_dir = raw_dir
        self.tensors: Dict[str, torch.Tensor] = {}
        self.raw: List[Dict[str, Any]] = []

    def key(self, path: Tuple[str, ...]) -> str:
        base = ".".join(path) or "value"
        key, n = base, 1
        while key in self.tensors or any(r["$tensor"] == key for r in self.raw):
            n += 1
            key = f"{base}~{n}"
        return key

    def raw_file(self, key: str, data: bytes, node: Dict[str, Any]) -> Dict[str, Any]:
        name = f"{self.raw_dir}/{len(self.raw):04d}.bin"
        os.makedirs(os.path.join(self.folder, self.raw_dir), exist_ok=True)
        with open(os.path.join(self.folder, name), "wb") as fh:
            fh.write(data)
        node = {"$tensor": key, **node, "file": name}
        self.raw.append(node)
        return node

    def tensor(self, value: torch.Tensor, path: Tuple[str, ...], kind: str, dtype: str) -> Dict[str, Any]:
        key = self.key(path)
        shape = list(value.shape)
        if _safetensors_takes(value.dtype):
            self.tensors[key] = value.contiguous()
            return {"$tensor": key, "kind": kind, "dtype": dtype, "shape": shape, "file": self.tensors_file}
        # Not a safetensors dtype (complex128, bits8 ...): its bytes, C order, little-endian.
        data = value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return self.raw_file(key, data, {"kind": kind, "dtype": dtype, "shape": shape, "byteorder": "little"})

    def walk(self, value: Any, path: Tuple[str, ...]) -> Any:
        if value is None or isinstance(value, (bool, int, str)):
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$float": repr(value)}
        if isinstance(value, bytes):
            return {"$bytes": base64.b64encode(value).decode("ascii")}
        if isinstance(value, torch.Tensor):
            return self.tensor(value, path, "torch", str(value.dtype))
        if isinstance(value, np.ndarray):
            if value.dtype.kind == "O":
                return {"$object_array": list(value.shape),
                        "items": [self.walk(v, path + (str(i),)) for i, v in enumerate(value.flat)]}
            if value.dtype.kind in "biufc" and value.dtype.isnative:
                try:
                    return self.tensor(torch.from_numpy(np.ascontiguousarray(value)), path, "numpy", value.dtype.str)
                except TypeError:
                    pass  # numpy dtypes torch lacks fall through to raw bytes
            data = np.ascontiguousarray(value).tobytes()
            return self.raw_file(self.key(path), data, {"kind": "numpy", "dtype": value.dtype.str,
                                                        "shape": list(value.shape)})
        if isinstance(value, np.generic):
            item = value.item()
            plain = item is None or isinstance(item, (bool, int, float, str, bytes))
            return {"$numpy_scalar": value.dtype.str, "value": self.walk(item, path) if plain else str(item)}
        if isinstance(value, list):
            return [self.walk(v, path + (str(i),)) for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"$tuple": [self.walk(v, path + (str(i),)) for i, v in enumerate(value)]}
        if isinstance(value, dict):
            if all(isinstance(k, str) and not k.startswith("$") for k in value):
                return {k: self.walk(v, path + (k,)) for k, v in value.items()}
            return {"$dict": [[self.walk(k, path + ("key",)), self.walk(v, path + (str(k),))]
                              for k, v in value.items()]}
        if isinstance(value, _Custom):
            return {"$custom": value.name, "value": self.walk(value.value, path)}
        raise TypeError(f"cannot export a {type(value).__name__} at {'.'.join(path) or 'the root'}")


def _export_one(reader: _Reader, ref: PayloadRef, step: int, folder: str, prefix: str) -> List[Dict[str, Any]]:
    """Write one payload into `folder` as ``<prefix>tensors.safetensors`` and ``<prefix>rest.json``.

    Returns:
        Where each tensor went: key, dtype, shape and file.
    """
    from safetensors.torch import save_file

    value = reader.load(ref, step)
    flat = _Flattener(folder, f"{prefix}tensors.safetensors", f"{prefix}raw")
    tree = flat.walk(value, ())
    if flat.tensors:
        save_file(flat.tensors, os.path.join(folder, flat.tensors_file),
                  metadata={"format": "stepjournal-export", "digest": ref.digest, "step": str(step)})
    with open(os.path.join(folder, f"{prefix}rest.json"), "w", encoding="utf-8") as fh:
        json.dump({"schema_version": EXPORT_FORMAT_VERSION, "digest": ref.digest, "value": tree}, fh, indent=1,
                  ensure_ascii=False, allow_nan=False)
    listed = [{"key": k, "dtype": str(t.dtype), "shape": list(t.shape), "file": flat.tensors_file}
              for k, t in flat.tensors.items()]
    return listed + [{"key": r["$tensor"], "dtype": r["dtype"], "shape": r["shape"], "file": r["file"]}
                     for r in flat.raw]


def cmd_export(args: argparse.Namespace, out: Console, err: Console) -> int:
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        raise _Failure("export needs safetensors: pip install safetensors") from None
    steps = _steps(args.steps) or StepRanges.every()
    target = os.path.abspath(args.to)
    if os.path.exists(target) and (not os.path.isdir(target) or os.listdir(target)):
        raise _Failure(f"--to {args.to}: exists and is not an empty folder; choose a new one")
    with _Reader(args.journal) as reader:
        journal = reader.journal
        run = _one_run(journal, args.run)
        wanted = [
            (step, index)
            for step in journal.recorded_steps(mode=args.mode, run=run)
            if step in steps
            for index in journal.recorded_indices(step, mode=args.mode, run=run)
        ]
        if not wanted:
            raise _Failure(f"run {run!r} has no recorded {args.mode} output at steps {steps}")
        os.makedirs(target, exist_ok=True)
        entries = []
        with _progress(err) as progress:
            task = progress.add_task("exporting", total=len(wanted))
            for step, index in wanted:
                recorded = journal.lookup(step, index, mode=args.mode, run=run)
                event = recorded.event
                name = f"step_{step:06d}_idx_{index}"
                folder = os.path.join(target, name)
                os.makedirs(folder)
                files = {"output": _export_one(reader, event.output, step, folder, "")}
                if args.inputs and event.input is not None:
                    files["input"] = _export_one(reader, event.input, step, folder, "input_")
                entries.append({
                    "dir": name,
                    "step": step,
                    "gen_index": index,
                    "seq": recorded.seq,
                    "session": event.session,
                    "policy": event.policy,
                    "reason": event.reason,
                    "ts": event.ts,
                    "time": iso_time(event.ts),
                    "output_digest": event.output.digest,
                    "input_digest": event.input_digest,
                    "tensors": files["output"],
                    "input_tensors": files.get("input"),
                })
                progress.advance(task)
    manifest = {
        "format": "stepjournal-export",
        "format_version": EXPORT_FORMAT_VERSION,
        "stepjournal_version": stepjournal.__version__,
        "journal": os.path.abspath(args.journal),
        "run": run,
        "mode": args.mode,
        "steps": str(steps),
        "entries": entries,
    }
    with open(os.path.join(target, "manifest.json"), "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, ensure_ascii=False)
    out.print(f"exported {len(entries)} recorded output{'s' * (len(entries) != 1)} of run {escape(run)} "
              f"to {escape(target)}")
    return 0


# -- timeline ----------------------------------------------------------------------------------------
def cmd_timeline(args: argparse.Namespace, out: Console, err: Console) -> int:
    from ._timeline import build_timeline, render

    extension = os.path.splitext(args.out)[1].lower()
    if extension not in (".png", ".svg", ".html"):
        raise _UsageError(f"--out {args.out}: name a .png, .svg or .html file")
    steps = _steps(args.steps)
    with _open(args.journal) as journal:
        records = journal.audit(run=args.run, steps=steps, mode=args.mode)
    if not records:
        raise _Failure(f"no generate calls in {args.journal} match; nothing to draw")
    runs = sorted({r.run for r in records})
    title = f"{os.path.basename(os.path.abspath(args.journal))}: run {', '.join(runs)}"
    try:
        render(build_timeline(records, title=title), args.out)
    except ImportError as exc:
        raise _Failure(str(exc)) from None
    out.print(f"wrote {escape(args.out)} ({len(records)} calls, {len({r.step for r in records})} steps)")
    return 0


# -- reindex -----------------------------------------------------------------------------------------
def cmd_reindex(args: argparse.Namespace, out: Console, err: Console) -> int:
    if not os.path.isfile(os.path.join(args.journal, "data.mdb")):
        raise _Failure(f"no journal at {args.journal!r}: the folder or its data.mdb is missing")
    # Maintenance records no calls, so it opens no session: the log keeps only what trainers did.
    with Journal(args.journal, session=False) as journal:
        count = journal.reindex()
    out.print(f"rebuilt the index of {escape(args.journal)} from {count} events")
    return 0


# -- import-verl -------------------------------------------------------------------------------------
def _verl_run_config(path: Optional[str]) -> Any:
    if path is None:
        return None
    from omegaconf import OmegaConf

    try:
        return OmegaConf.load(path)
    except Exception as exc:  # a missing file or YAML that does not parse: say which
        raise _Failure(f"--config {path!r} cannot be read as a verl config: {exc}") from None


def cmd_import_verl(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Import verl RolloutSkip / SkipManager dump folders into a journal (writes to it; docs/verl.md)."""
    try:
        from stepjournal.adapters.verl import import_verl_dumps
    except ImportError as exc:
        raise _Failure(f"import-verl needs verl: pip install 'stepjournal[verl]' ({exc})") from None
    if not args.trust_pickle:
        # Refuses, saying why, before any dump is read and before a progress bar is drawn.
        import_verl_dumps(args.dump_dir, args.journal, trust_pickle=False)
    with _progress(err) as progress:
        task = progress.add_task("importing verl dumps", total=None)
        report = import_verl_dumps(
            args.dump_dir,
            args.journal,
            trust_pickle=True,
            config=_verl_run_config(args.config),
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    if args.json:
        _print_json(report.to_json())
        return 0 if report.ok else 1
    table = Table(title=f"imported into {escape(report.journal)}")
    for column in ("run", "step", "index", "form", "input", "source"):
        table.add_column(column)
    for row in report.imported:
        table.add_row(escape(row.run), str(row.step), str(row.gen_index), row.form,
                      "yes" if row.stored_input else "no", escape(row.source))
    out.print(table)
    for row in report.skipped:
        err.print(f"[yellow]skipped[/] {escape(row.source)}: {escape(row.reason)}")
    for row in report.failed:
        err.print(f"[red]failed[/] {escape(row.source)}: {escape(row.reason)}")
    out.print(f"{len(report.imported)} imported, {len(report.skipped)} skipped, {len(report.failed)} failed")
    return 0 if report.ok else 1


# -- parser and entry point --------------------------------------------------------------------------
def _parser() -> _Parser:
    parser = _Parser(
        prog="stepjournal",
        description="Inspect, check, export and draw stepjournal journals (read-only, except reindex and import-verl).",
    )
    parser.add_argument("--version", action="version", version=f"stepjournal {stepjournal.__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more to stderr (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, fn: Callable[..., int], help: str) -> _Parser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
        p.set_defaults(fn=fn)
        return p

    p = command("runs", cmd_runs, "run keys, sessions, fingerprints and call counts")
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per run")

    p = command("audit", cmd_audit, "one row per generate call, in log order")
    p.add_argument("--run", help="only this run key")
    p.add_argument("--steps", metavar="RANGES", help="only these steps, e.g. '1-10,20,30-40:2,50-'")
    p.add_argument("--mode", help="only this mode (train, validate ...)")
    p.add_argument("--action", action="append", choices=ACTIONS, help="only this action (repeatable)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print a JSON array of objects (docs/audit.md)")
    fmt.add_argument("--csv", action="store_true", help="print CSV with a header row")

    p = command("show", cmd_show, "the structure of a recorded payload: keys, dtypes, shapes, first values")
    p.add_argument("step", metavar="STEP", type=_nonneg_int, help="the train step")
    p.add_argument("--index", type=_nonneg_int, default=0, help="which call within the step (default 0)")
    p.add_argument("--run", help="the run key (needed when the journal holds several)")
    p.add_argument("--mode", default="train", help="the mode (default train)")
    p.add_argument("--input", action="store_true", help="show the stored input instead of the output")
    p.add_argument("--items", type=_nonneg_int, default=20, help="items shown per container (default 20)")
    p.add_argument("--json", action="store_true", help="print the structure as JSON")

    p = command("verify", cmd_verify, "re-hash every payload, decode every event, check the index")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = command("export", cmd_export, "write recorded payloads as safetensors + JSON")
    p.add_argument("--to", required=True, metavar="DIR", help="a new or empty folder to write into")
    p.add_argument("--steps", metavar="RANGES", help="only these steps (default: every recorded step)")
    p.add_argument("--run", help="the run key (needed when the journal holds several)")
    p.add_argument("--mode", default="train", help="the mode (default train)")
    p.add_argument("--inputs", action="store_true", help="export stored inputs too")

    p = command("timeline", cmd_timeline, "draw the run: a column per step, replays linked to their source")
    p.add_argument("--out", required=True, metavar="FILE", help="FILE.png, FILE.svg or FILE.html")
    p.add_argument("--run", help="only this run key")
    p.add_argument("--steps", metavar="RANGES", help="only these steps")
    p.add_argument("--mode", help="only this mode")

    command("reindex", cmd_reindex, "rebuild the index (a projection) from the event log; writes to the journal")

    p = sub.add_parser("import-verl", help="import verl RolloutSkip / SkipManager dumps into a journal (writes)",
                       description="Import verl RolloutSkip (v1, v2) and SkipManager dump folders into a journal, "
                       "keeping their steps; records are marked as imported. The dumps are Python pickles: "
                       "nothing is loaded without --trust-pickle.")
    p.add_argument("dump_dir", metavar="DUMP_DIR", help="verl's skip dump_dir, or a folder below it")
    p.add_argument("--into", dest="journal", required=True, metavar="JOURNAL",
                   help="the journal folder to write into (created when missing)")
    p.add_argument("--trust-pickle", action="store_true",
                   help="load the dumps although they are pickles (only for dumps you made, in a folder only you write)")
    p.add_argument("--config", metavar="YAML", default=None,
                   help="the verl config of the run that wrote the dumps (e.g. its .hydra/config.yaml): its model, "
                   "sampling settings and train files join the records' fingerprint")
    p.add_argument("--json", action="store_true", help="print the import report as JSON")
    p.set_defaults(fn=cmd_import_verl)
    return parser


def _nonneg_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _log_level(verbosity: int) -> int:
    return {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)


@contextlib.contextmanager
def _consoles() -> Iterator[Tuple[Console, Console]]:
    out = Console(highlight=False)
    if not out.is_terminal:
        # A pipe or a file has no width; do not squeeze a wide audit table into 80 columns.
        out = Console(highlight=False, width=max(out.width, 200))
    yield out, Console(stderr=True, highlight=False)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 failure or damage found, 2 bad arguments)."""
    try:
        args = _parser().parse_args(argv)
    except _UsageError as exc:
        print(f"stepjournal: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0)
    # The command line owns the library's log output while it runs; called in-process (tests,
    # notebooks) it hands the caller's logging configuration back afterwards.
    try:
        with console_logging(_log_level(args.verbose)), _consoles() as (out, err):
            return args.fn(args, out, err)
    except _UsageError as exc:
        print(f"stepjournal: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except IntegrityError as exc:
        print(f"stepjournal: error: {_one_line(exc)}; run `stepjournal verify {args.journal}` for the full picture",
              file=sys.stderr)
        return 1
    except (_Failure, StepJournalError, OSError) as exc:
        print(f"stepjournal: error: {_one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stepjournal: interrupted", file=sys.stderr)
        return 130
