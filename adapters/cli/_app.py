"""The `stepjournal` command line: look into a journal, check it, export it, draw it, rebuild its index.

Every command but `reindex` and `import-verl` opens the journal read-only: it changes no byte of the
journal's data, works while a trainer is writing to it, and works on a copy in a read-only place.
Tables and progress go through rich (progress on stderr); ``--json`` and ``--csv`` print plain
machine-readable text. Errors print one line, ``stepjournal: error: ...``: exit status 2 for bad
arguments, 1 for failures.

This module holds the parser and `main`; each verb is a module of this package (``_runs``,
``_audit``, ``_show``, ``_verify``, ``_export``, ``_timeline``, ``_reindex``, ``_import_verl``),
imported only when its verb runs, so ``stepjournal --help`` loads no table, tensor or plotting code.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import Any, Callable, List, Optional

import stepjournal
from stepjournal import IntegrityError, StepJournalError
from stepjournal._audit import ACTIONS
from stepjournal._log import console_logging

from ._render import Failure, UsageError, consoles, one_line

__all__ = ["main"]


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line on stderr, not a usage dump and a SystemExit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _verb(module: str) -> Callable[..., int]:
    """The verb in module ``_<module>`` of this package, imported when it runs."""

    def run(args: argparse.Namespace, out: Any, err: Any) -> int:
        return importlib.import_module(f"{__package__}._{module}").run(args, out, err)

    return run


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

    p = command("runs", _verb("runs"), "run keys, sessions, fingerprints and call counts")
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per run")

    p = command("audit", _verb("audit"), "one row per generate call, in log order")
    p.add_argument("--run", help="only this run key")
    p.add_argument("--steps", metavar="RANGES", help="only these steps, e.g. '1-10,20,30-40:2,50-'")
    p.add_argument("--mode", help="only this mode (train, validate ...)")
    p.add_argument("--action", action="append", choices=ACTIONS, help="only this action (repeatable)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print a JSON array of objects (docs/audit.md)")
    fmt.add_argument("--csv", action="store_true", help="print CSV with a header row")

    p = command("show", _verb("show"), "the structure of a recorded payload: keys, dtypes, shapes, first values")
    p.add_argument("step", metavar="STEP", type=_nonneg_int, help="the train step")
    p.add_argument("--index", type=_nonneg_int, default=0, help="which call within the step (default 0)")
    p.add_argument("--run", help="the run key (needed when the journal holds several)")
    p.add_argument("--mode", default="train", help="the mode (default train)")
    p.add_argument("--input", action="store_true", help="show the stored input instead of the output")
    p.add_argument("--items", type=_nonneg_int, default=20, help="items shown per container (default 20)")
    p.add_argument("--json", action="store_true", help="print the structure as JSON")

    p = command("verify", _verb("verify"), "re-hash every payload, decode every event, check the index")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = command("export", _verb("export"), "write recorded payloads as safetensors + JSON")
    p.add_argument("--to", required=True, metavar="DIR", help="a new or empty folder to write into")
    p.add_argument("--steps", metavar="RANGES", help="only these steps (default: every recorded step)")
    p.add_argument("--run", help="the run key (needed when the journal holds several)")
    p.add_argument("--mode", default="train", help="the mode (default train)")
    p.add_argument("--inputs", action="store_true", help="export stored inputs too")

    p = command("timeline", _verb("timeline"), "draw the run: a column per step, replays linked to their source")
    p.add_argument("--out", required=True, metavar="FILE", help="FILE.png, FILE.svg or FILE.html")
    p.add_argument("--run", help="only this run key")
    p.add_argument("--steps", metavar="RANGES", help="only these steps")
    p.add_argument("--mode", help="only this mode")

    command("reindex", _verb("reindex"), "rebuild the index (a projection) from the event log; writes to the journal")

    p = sub.add_parser("import-verl", help="import verl RolloutSkip / SkipManager dumps into a journal (writes)",
                       description="Import verl RolloutSkip (v1, v2), SkipManager and V1 skip.rollout_tq dump folders into a journal, "
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
    p.set_defaults(fn=_verb("import_verl"))
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


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 failure or damage found, 2 bad arguments)."""
    try:
        args = _parser().parse_args(argv)
    except UsageError as exc:
        print(f"stepjournal: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0)
    # The command line owns the library's log output while it runs; called in-process (tests,
    # notebooks) it hands the caller's logging configuration back afterwards.
    try:
        with console_logging(_log_level(args.verbose)), consoles() as (out, err):
            return args.fn(args, out, err)
    except UsageError as exc:
        print(f"stepjournal: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except IntegrityError as exc:
        print(f"stepjournal: error: {one_line(exc)}; run `stepjournal verify {args.journal}` for the full picture",
              file=sys.stderr)
        return 1
    except (Failure, StepJournalError, OSError) as exc:
        print(f"stepjournal: error: {one_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stepjournal: interrupted", file=sys.stderr)
        return 130
