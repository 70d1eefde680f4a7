"""``stepjournal show``: the structure of one recorded payload, with the first values of each tensor.

Payloads are read through `stepjournal.tools.OpaqueReader`: no codec needs to be registered.
"""

from __future__ import annotations

import argparse
import math
from typing import Any, Dict, List, Optional, Tuple

from rich.console import Console
from rich.tree import Tree

from stepjournal import Journal
from stepjournal.events import (AUDIT_SCHEMA_VERSION, CallBypassed, CallRefused, GenerationRecorded, PayloadRef,
                                PayloadsReleased, ReplayServed)
from stepjournal.index import AuditRecord
from stepjournal.policies import StepRanges
from stepjournal.vocabulary import DEFAULT_MODE, Action

from ._args import nonneg_int
from ._common import choose_run, key_word
from ._preview import EDGE, inline, inline_array, is_scalar
from ._show_light import light_payload
from ._render import ACTION_STYLE, Failure, UsageError, cell, clean, human_size, int_text, print_json, short_time

__all__ = ["add_arguments", "run"]


_PREVIEW_VALUES = 6

# The events a step filter yields: one per call, and the releases of calls' payloads.
_STEP_EVENTS = (GenerationRecorded, ReplayServed, CallBypassed, CallRefused, PayloadsReleased)


def _find_call(journal: Journal, run: str, mode: str, step: int, index: int,
               stage: str = "generate") -> Tuple[int, Any]:
    """The call whose payload `show` displays: the latest recorded output there, else the latest call."""
    recorded = journal.lookup(step, index, mode=mode, run=run, stage=stage)
    if recorded is not None:
        return recorded.seq, recorded.event
    latest = None
    for seq, event in journal.events(run=run, steps={step}, stage=stage):
        if isinstance(event, _STEP_EVENTS) and (event.mode, event.gen_index) == (mode, index):
            latest = (seq, event)
    if latest is None:
        where = clean(mode) if stage == "generate" else f"{clean(mode)}, stage {clean(stage)}"
        indices = journal.recorded_indices(step, mode=mode, run=run, stage=stage)
        if indices:
            raise Failure(f"step {step} of run {clean(run)!r} ({where}) has no call #{index}; it has {indices}")
        recorded_steps = journal.recorded_steps(mode=mode, run=run, stage=stage)
        stages = ", ".join(clean(s) for s in journal.stages(run=run)) or "none"
        raise Failure(
            f"run {clean(run)!r} has no {where} call at step {step}; recorded steps: "
            f"{str(StepRanges.from_steps(recorded_steps)) or 'none'}; stages with calls: {stages}"
        )
    return latest


def _preview(value: Any) -> Optional[List[Any]]:
    """The first few values of a tensor or array, as JSON-able Python numbers (None when not numeric)."""
    import numpy as np  # imported by `run`'s reader already; here, so that building the parser imports neither

    try:
        if type(value).__module__.split(".")[0] == "torch":  # a tensor: torch is imported already, by its decode
            import torch

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


def _annotate(node: Dict[str, Any], value: Any, inline_text: bool = False) -> None:
    """Add a "preview" of the first values to every tensor and array node of a `describe_payload` tree; with
    `inline_text`, an "inline" text too (`_preview`: first and last values, as torch prints a tensor) on
    those and on every list or tuple of scalars, whose items are then not listed one a line."""
    import numpy as np  # imported by `run`'s reader already; here, so that building the parser imports neither

    from stepjournal.tools import OpaqueValue

    def walk(node: Dict[str, Any], value: Any) -> None:
        kind = node.get("kind")
        if kind in ("tensor", "ndarray"):
            preview = _preview(value)
            if preview is not None:
                node["preview"] = preview
            text = inline_array(value, rows_apart=True) if inline_text else None
            if text is not None:
                node["values"] = text  # on lines of their own under the node, as torch prints a tensor
        elif kind in ("list", "tuple") and isinstance(value, (list, tuple)):
            if inline_text and value and all(is_scalar(v) for v in value):
                node["inline"] = inline(value, edge=2 if any(isinstance(v, str) for v in value) else EDGE)
                return
            for child, item in zip(node["items"], value):
                walk(child, item)
        elif kind == "dict" and isinstance(value, dict):
            for child, item in zip(node["items"], value.values()):
                walk(child["value"], item)
        elif kind == "object_array" and isinstance(value, np.ndarray):
            for child, item in zip(node["items"], value.flat):
                walk(child, item)
        elif kind == "ext" and isinstance(value, OpaqueValue):
            walk(node["value"], value.value)

    walk(node, value)


def _node_text(node: Dict[str, Any]) -> str:
    kind = node["kind"]
    if kind in ("tensor", "ndarray"):
        text = f"[cyan]{kind}[/] {cell(node['dtype'])} {node['shape']} {human_size(node['nbytes'])}"
        return text
    if kind in ("list", "tuple", "dict"):
        text = f"[cyan]{kind}[/] ({node['length']} {'keys' if kind == 'dict' else 'items'})"
        return text + (f"  [dim]{cell(node['inline'])}[/]" if "inline" in node else "")
    if kind == "object_array":
        return f"[cyan]object array[/] {node['shape']}"
    if kind == "str":
        return f"[cyan]str[/] {cell(repr(node['value']))}" + (
            f" [dim]({node['length']} chars)[/]" if node["length"] > len(node["value"]) else ""
        )
    if kind == "bytes":
        return f"[cyan]bytes[/] {human_size(node['nbytes'])}"
    if kind == "none":
        return "[cyan]None[/]"
    if kind == "ext":
        return f"[cyan]custom[/] {cell(node['name'])} [dim](as its codec stored it)[/]"
    if kind == "int" and "value" not in node:  # past 256 bits describe_payload gives its size and hex
        digits = int(node["bits"] * 0.30103) + 1
        return f"[cyan]int[/] of about {digits} digits ({node['bits']} bits) [dim]{cell(node.get('hex', ''))}[/]"
    value = node.get("value")
    return f"[cyan]{kind}[/] {cell(int_text(value) if isinstance(value, int) else value)}"


def _tree(node: Dict[str, Any], tree: Tree) -> None:
    kind = node["kind"]
    if "values" in node:
        tree.add("\n".join(f"[dim]{cell(line)}[/]" for line in node["values"].split("\n")))
    if "inline" in node:  # its items are on its own line
        return
    if kind == "dict":
        for item in node["items"]:
            child = tree.add(f"[bold]{cell(item['key'])}[/]: {_node_text(item['value'])}")
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


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal show``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    p.add_argument("step", metavar="STEP", type=nonneg_int, help="the train step")
    p.add_argument("--index", type=nonneg_int, default=0, help="which call within the step (default 0)")
    p.add_argument("--run", type=key_word("run"), help="the run key (needed when the journal holds several)")
    p.add_argument("--mode", type=key_word("mode"), default=DEFAULT_MODE, help="the mode (default train)")
    p.add_argument("--stage", type=key_word("stage"), default="generate",
                   help="the stage (default generate; reward ...)")
    p.add_argument("--input", action="store_true", help="show the stored input instead of the output")
    p.add_argument("--items", type=nonneg_int, default=20, help="items shown per container (default 20)")
    p.add_argument("--text", action="store_true", help="each sample of the generate call, decoded, with its reward "
                   "and log-prob (docs/reading.md)")
    p.add_argument("--tokenizer", metavar="PATH", help="with --text: the tokenizer folder (default: the one the run "
                   "kept in the journal, else the one its fingerprint names); loaded from local files only")
    p.add_argument("--json", action="store_true", help="print the structure as JSON")
    p.add_argument("--sample", type=nonneg_int, help="with --text: that sample as its turns: the assistant's text, "
                   "then each tool call with its arguments, response and outcome (docs/agents.md)")
    p.add_argument("--no-pager", action="store_true",
                   help="on a terminal, print straight to it instead of through $PAGER (less)")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.sample is not None and not args.text:
        raise UsageError("--sample goes with --text (show STEP --text --sample S: a sample's tool calls)")
    if args.text and args.sample is not None:
        from ._tool_views import run_show

        return run_show(args, out, err)
    if args.text:
        from ._show_text import run as show_text

        return show_text(args, out, err)
    if args.tokenizer is not None:
        raise UsageError("--tokenizer goes with --text")
    from stepjournal.tools import OpaqueReader

    with OpaqueReader(args.journal) as reader:  # a wrong path, run or step is said before torch is imported
        journal = reader.journal
        run = choose_run(journal, args.run)
        stage = getattr(args, "stage", "generate")
        seq, event = _find_call(journal, run, args.mode, args.step, args.index, stage)
        ref: Optional[PayloadRef]
        if isinstance(event, GenerationRecorded):
            ref = event.input if args.input else event.output
        elif isinstance(event, ReplayServed) and not args.input:
            ref = event.output
        else:
            ref = None
        record = AuditRecord.from_event(seq, event)
        what = "input" if args.input else "output"
        if isinstance(event, PayloadsReleased):
            released = journal.as_read_here(seq, event)  # a pulled release names its record by the seq here
            assert isinstance(released, PayloadsReleased)  # as_read_here keeps the event's type
            raise Failure(
                f"step {args.step} call #{args.index} of run {clean(run)!r} ({clean(args.mode)}) was recorded "
                f"(event #{released.record_seq}); its payloads were pruned by event #{seq} at "
                f"{short_time(released.ts)} UTC: {clean(released.reason)} (rule: {clean(released.rule)})"
            )
        if ref is None and record.action == Action.GENERATED and not record.stored and not args.input:
            raise Failure(
                f"step {args.step} call #{args.index} of run {run!r} ({args.mode}) was generated, not stored "
                f"(event #{seq}): {record.reason}"
            )
        if ref is None:
            raise Failure(
                f"step {args.step} call #{args.index} of run {clean(run)!r} ({clean(args.mode)}) was {record.action} "
                f"(event #{seq}) and has no stored {what}"
            )
        raw = journal.payload_bytes(ref.digest)
        light = light_payload(raw, ref.digest, args.items)  # numpy and msgpack: no torch, when the payload allows
        if light is not None:
            structure, value = light
        else:
            from stepjournal.payloads import describe_payload  # torch

            structure, value = describe_payload(raw, max_items=args.items), reader.load(ref, args.step)
        _annotate(structure, value, inline_text=not args.json)
    header = record.to_json()
    header.pop("schema_version")
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, "call": header, "payload": what,
                     "digest": ref.digest, "nbytes": ref.nbytes, "structure": structure})
        return 0
    from ._pager import paged

    with paged(out, enabled=not args.no_pager) as page:
        _print_call(page, args, run, seq, record, what, ref, structure)
    return 0


def _print_call(out: Console, args: argparse.Namespace, run: str, seq: int, record: AuditRecord, what: str,
                ref: PayloadRef, structure: Dict[str, Any]) -> None:
    title = (f"run {cell(run)} · {cell(args.mode)} · stage {cell(record.stage)} · step {args.step} · "
             f"call #{args.index} · event #{seq}")
    out.print(f"[bold]{title}[/]")
    line = f"[{ACTION_STYLE[record.action]}]{record.action}[/]"
    if record.action == Action.REPLAYED:
        line += f" from step {record.source_step} call #{record.source_gen_index} (event #{record.source_seq})"
    out.print(f"{line} by policy {cell(record.policy)}: {cell(record.reason)}, at {short_time(record.ts)} UTC")
    out.print(f"{what} {ref.digest} · {human_size(ref.nbytes)}"
              + (f" ({human_size(ref.stored_nbytes)} stored, {ref.compression})" if ref.compression else ""))
    root = Tree(_node_text(structure))
    _tree(structure, root)
    out.print(root)
