"""``stepjournal export``: recorded payloads as safetensors + JSON (`export_payloads`), a bundle (`export_bundle`), or
TensorBoard event files (`_export_tensorboard`)."""

from __future__ import annotations

import argparse
import os

from rich.console import Console

import attrs

from stepjournal.events import AUDIT_SCHEMA_VERSION
from stepjournal.sharing import export_bundle
from stepjournal.policies import StepRanges
from stepjournal.vocabulary import DEFAULT_MODE

from ._args import nonneg_int
from ._common import parse_steps, key_word
from ._progress import progress_to
from ._render import Failure, UsageError, cell, human_size, print_json, print_line

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal export``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", metavar="DIR", help="a new or empty folder to write safetensors + JSON into")
    where.add_argument("--bundle", metavar="FILE", help="a new bundle file: the selection's events and payloads, "
                       "for `stepjournal import` (docs/sharing.md)")
    where.add_argument("--tensorboard", metavar="DIR", help="TensorBoard event files, a folder per session: per-step "
                       "rewards, lengths, stage times, the metrics stage, and a few samples (docs/reading.md)")
    p.add_argument("--steps", metavar="RANGES", help="only these steps (default: every recorded step)")
    p.add_argument("--run", type=key_word("run"), action="append",
                   help="the run key (--to, --tensorboard: needed when the journal holds several; --bundle: repeat "
                   "for several, default every run)")
    p.add_argument("--mode", type=key_word("mode"), action="append",
                   help="the mode (--to: default train; --bundle: repeat, default every mode)")
    p.add_argument("--stage", type=key_word("stage"), action="append",
                   help="--bundle only: only this stage (repeat for several; default every stage)")
    p.add_argument("--inputs", action="store_true", help="--to only: export stored inputs too")
    p.add_argument("--json", action="store_true", help="--bundle only: print the bundle report as JSON")
    p.add_argument("--session", metavar="S", help="--tensorboard only: only this session (its name as runs shows "
                   "it, s2; or its id or a unique prefix); default: each session of the run")
    p.add_argument("--tokenizer", metavar="PATH", help="--tensorboard only: the tokenizer folder (default: the one the "
                   "run's fingerprint names; without one, the samples are token ids)")
    p.add_argument("--no-text", action="store_true", help="--tensorboard only: token ids, no tokenizer")
    p.add_argument("--samples", type=nonneg_int, metavar="N",
                   help="--tensorboard only: samples shown per step (default 4)")
    p.add_argument("--chars", type=nonneg_int, metavar="N",
                   help="--tensorboard only: characters (or token ids) kept of each prompt and response (default 2000)")


_TENSORBOARD_ONLY = ("--session", "--tokenizer", "--no-text", "--samples", "--chars")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.tensorboard is not None:
        return _tensorboard(args, out, err)
    for flag in _TENSORBOARD_ONLY:
        if getattr(args, flag[2:].replace("-", "_")) not in (None, False):
            raise UsageError(f"{flag} goes with --tensorboard")
    if args.bundle is not None:
        return _bundle(args, out, err)
    for flag, given in (("--stage", args.stage), ("--json", args.json)):
        if given:
            raise UsageError(f"{flag} goes with --bundle; --to exports recorded generate outputs")
    for flag, given in (("--run", args.run), ("--mode", args.mode)):
        if given and len(given) > 1:
            raise UsageError(f"{flag} once with --to (it exports one run and mode); repeat it with --bundle")
    steps = parse_steps(args.steps) or StepRanges.every()
    from stepjournal.tools import export_payloads  # torch comes with the first payload (through safetensors)

    with progress_to(err, quiet=args.json) as update:
        def exported(done: int, total: int, moved: int) -> None:
            update("export", done, total, moved)

        exported.counts_bytes = True  # type: ignore[attr-defined]
        try:
            manifest = export_payloads(
                args.journal,
                args.to,
                run=args.run[0] if args.run else None,
                mode=args.mode[0] if args.mode else DEFAULT_MODE,
                steps=steps,
                inputs=args.inputs,
                progress=exported,
            )
        except ImportError as exc:  # raised before the first payload, so before a progress bar is drawn
            if exc.name != "safetensors":
                raise
            raise Failure("export needs safetensors: pip install 'safetensors>=0.4'") from None
    count = len(manifest["entries"])
    print_line(out, f"exported {count} recorded output{'s' * (count != 1)} of run {cell(manifest['run'])} "
                    f"to {cell(os.path.abspath(args.to))}")
    return 0


def _bundle(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.inputs:
        raise UsageError("--inputs goes with --to; a bundle holds every stored input of what it selects")
    with progress_to(err, quiet=args.json) as progress:
        report = export_bundle(args.journal, args.bundle, runs=args.run, modes=args.mode, stages=args.stage,
                               steps=parse_steps(args.steps), progress=progress)
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, **attrs.asdict(report)})
    else:
        sources = len(report.sources)
        print_line(out, f"bundled {report.events} events and {report.payloads} payloads from {sources} "
                        f"journal{'s' * (sources != 1)} into {cell(report.path)} ({human_size(report.nbytes)})")
    return 0


def _tensorboard(args: argparse.Namespace, out: Console, err: Console) -> int:
    for flag, given in (("--steps", args.steps), ("--mode", args.mode), ("--stage", args.stage),
                        ("--inputs", args.inputs), ("--json", args.json)):
        if given:
            raise UsageError(f"{flag} does not go with --tensorboard: it writes every train step of the run's sessions")
    if args.run and len(args.run) > 1:
        raise UsageError("--run once with --tensorboard (it exports one run's sessions)")
    from ._export_tensorboard import run as export_tensorboard

    chosen = {"samples": 4 if args.samples is None else args.samples,
              "chars": 2000 if args.chars is None else args.chars}
    return export_tensorboard(argparse.Namespace(**{**vars(args), **chosen}), out, err)
