"""The `stepjournal` command line: look into a journal, check it, export it, draw it, rebuild its index.

Every command but `reindex`, `prune`, `compact`, `import-verl`, `import`, `pull`, `clone` and `remote add|remove`
(which writes the folder's remotes.json, not the journal's data) opens the journal read-only: it changes no byte of the
journal's data, works while a trainer is writing to it, and works on a copy in a read-only place.
Tables and progress go through rich (progress on stderr); ``--json`` and ``--csv`` print plain
machine-readable text. Errors print one line, ``stepjournal: error: ...``: exit status 2 for bad
arguments, 1 for failures.

This module holds the parser and `main`; each verb is a module of this package (``_runs``,
``_audit``, ``_show``, ``_verify``, ``_export``, ``_timeline``, ``_reindex``, ``_import_verl``,
``_plugins``, ``_push``, ``_pull``, ``_clone``, ``_remote``, ``_status``, ``_import``, ``_diff``, ``_prune``,
``_compact``, ``_completion``), imported only when its verb runs (``_examples`` holds the examples that
end each verb's help), so ``stepjournal --help`` loads no table,
tensor or plotting code of its own. Like other Unix tools it stops quietly when the reader of its
output goes away (``stepjournal audit J --csv | head -1``): no message, exit status 141.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any, Callable, List, Optional

import stepjournal
from stepjournal import IntegrityError, StepJournalError
from stepjournal._audit import ACTIONS
from stepjournal.log import console_logging

from ._examples import examples_text
from ._render import Failure, UsageError, consoles, error_line, one_line

_BROKEN_PIPE_STATUS = 128 + 13  # what a shell reports for a process killed by SIGPIPE

__all__ = ["main", "build_parser"]


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
def _merge_options(p: argparse.ArgumentParser) -> None:
    """The ways out of an import conflict (docs/sharing.md, "When records conflict")."""
    p.add_argument("--as", dest="runs_as", action="append", metavar="NEW|OLD=NEW",
                   help="import under another run key: NEW for every incoming run, or OLD=NEW (repeat for several)")
    p.add_argument("--keep", choices=["ours"], help="ours: where an incoming record differs from one this journal "
                   "serves, import it for the audit and keep serving this journal's")


def build_parser() -> _Parser:
    """The whole command line's parser (shell completion reads its verbs and options from it)."""
    parser = _Parser(
        prog="stepjournal",
        description="Inspect, check, export, draw and share stepjournal journals (read-only, except reindex, prune, "
        "compact, import-verl, import, pull and clone).",
    )
    parser.add_argument("--version", action="version", version=f"stepjournal {stepjournal.__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more to stderr (-vv: debug)")
    # The global options work after the verb too (``stepjournal audit J -v``): each verb's parser
    # repeats them under another name, added to the ones given before the verb.
    late = _Parser(add_help=False)
    late.add_argument("-v", "--verbose", dest="verbose_late", action="count", default=0,
                      help="log more to stderr (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, fn: Callable[..., int], help: str, *, journal: bool = True) -> _Parser:
        p = sub.add_parser(name, help=help, description=help, parents=[late], epilog=examples_text(name),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        if journal:
            p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
        p.set_defaults(fn=fn)
        return p

    p = command("runs", _verb("runs"), "run keys, sessions, fingerprints and call counts")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--wide", action="store_true", help="every column (the default view fits 80 columns)")
    fmt.add_argument("--json", action="store_true", help="print a JSON array, one object per run")
    p.add_argument("--stage", help="count only the calls of this stage (generate, reward ...)")

    p = command("audit", _verb("audit"), "one row per generate call, in log order")
    p.add_argument("--run", help="only this run key")
    p.add_argument("--steps", metavar="RANGES", help="only these steps, e.g. '1-10,20,30-40:2,50-'")
    p.add_argument("--mode", help="only this mode (train, validate ...)")
    p.add_argument("--stage", help="only this stage (generate, reward ...)")
    p.add_argument("--action", action="append", choices=(*ACTIONS, "released"),
                   help="only this action (repeatable; released: retention's releases)")
    p.add_argument("-n", "--limit", type=_nonneg_int, metavar="N", help="only the first N calls")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--wide", action="store_true", help="every column (the default view fits 80 columns)")
    fmt.add_argument("--summary", action="store_true",
                     help="one line per range of steps that went alike ('steps 1-2000 generated by cache')")
    fmt.add_argument("--json", action="store_true", help="print a JSON array of objects (docs/audit.md)")
    fmt.add_argument("--csv", action="store_true", help="print CSV with a header row")
    p.add_argument("--no-pager", action="store_true",
                   help="never page (a table on a terminal goes through $PAGER, else less -FRX)")

    p = command("show", _verb("show"), "the structure of a recorded payload: keys, dtypes, shapes, first values")
    p.add_argument("step", metavar="STEP", type=_nonneg_int, help="the train step")
    p.add_argument("--index", type=_nonneg_int, default=0, help="which call within the step (default 0)")
    p.add_argument("--run", help="the run key (needed when the journal holds several)")
    p.add_argument("--mode", default="train", help="the mode (default train)")
    p.add_argument("--stage", default="generate", help="the stage (default generate; reward ...)")
    p.add_argument("--input", action="store_true", help="show the stored input instead of the output")
    p.add_argument("--items", type=_nonneg_int, default=20, help="items shown per container (default 20)")
    p.add_argument("--text", action="store_true", help="each sample of the generate call, decoded, with its reward "
                   "and log-prob (docs/reading.md)")
    p.add_argument("--tokenizer", metavar="PATH", help="with --text: the tokenizer folder (default: the one the "
                   "run's fingerprint names); loaded from local files only")
    p.add_argument("--json", action="store_true", help="print the structure as JSON")

    p = command("verify", _verb("verify"), "re-hash every payload, decode every event, check the index "
                "(JOURNAL may be a bundle file: checked without importing it)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = command("export", _verb("export"), "write recorded payloads as safetensors + JSON, or a portable bundle")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--to", metavar="DIR", help="a new or empty folder to write safetensors + JSON into")
    where.add_argument("--bundle", metavar="FILE", help="a new bundle file: the selection's events and payloads, "
                       "for `stepjournal import` (docs/sharing.md)")
    p.add_argument("--steps", metavar="RANGES", help="only these steps (default: every recorded step)")
    p.add_argument("--run", action="append", help="the run key (--to: needed when the journal holds several; "
                   "--bundle: repeat for several, default every run)")
    p.add_argument("--mode", action="append", help="the mode (--to: default train; --bundle: repeat, default every mode)")
    p.add_argument("--stage", action="append", help="--bundle only: only this stage (repeat for several; default every stage)")
    p.add_argument("--inputs", action="store_true", help="--to only: export stored inputs too")
    p.add_argument("--json", action="store_true", help="--bundle only: print the bundle report as JSON")

    p = command("import", _verb("import"), "bring a bundle's events and payloads into a journal (writes)", journal=False)
    p.add_argument("bundle", metavar="FILE", help="a bundle written by `stepjournal export --bundle`")
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder (created when missing)")
    p.add_argument("--json", action="store_true", help="print the import report as JSON")
    _merge_options(p)

    p = command("timeline", _verb("timeline"), "draw the run: a column per step, replays linked to their source")
    p.add_argument("--out", required=True, metavar="FILE", help="FILE.png, FILE.svg or FILE.html")
    p.add_argument("--run", help="only this run key")
    p.add_argument("--steps", metavar="RANGES", help="only these steps")
    p.add_argument("--mode", help="only this mode")

    command("reindex", _verb("reindex"), "rebuild the index (a projection) from the event log; writes to the journal")

    p = command("prune", _verb("prune"), "release the payloads of steps retention rules do not keep; events stay (writes)")
    p.add_argument("--keep-last", type=_nonneg_int, metavar="N", help="keep the N largest recorded steps of each run and mode")
    p.add_argument("--pin", metavar="RANGES", help="always keep these steps, e.g. '1-5,100'")
    p.add_argument("--max-bytes", metavar="SIZE", help="cap each run and mode's stored bytes, e.g. 10G (smallest steps go first)")
    p.add_argument("--run", help="only this run key (default: every run)")
    p.add_argument("--mode", help="only this mode (default: every mode)")
    p.add_argument("--stage", help="only this stage (default: every stage, each kept on its own)")
    p.add_argument("--no-keep-replayed", action="store_true", help="release steps a session replayed from too")
    p.add_argument("--all", action="store_true", help="allow releasing every step of a run and mode")
    p.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")

    p = command("compact", _verb("compact"), "write a compacted copy and swap it in, so freed space returns to the disk (writes)")
    p.add_argument("--to", metavar="DIR", help="write the compacted journal into this new folder instead (original unchanged)")
    p.add_argument("--json", action="store_true", help="print the sizes as JSON")

    p = sub.add_parser("import-verl", parents=[late], help="import verl RolloutSkip / SkipManager dumps into a journal (writes)",
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

    # Sharing through object storage (docs/sharing.md): push reads the journal, pull and clone write one.
    remote_help = ("a remote's name (stepjournal remote list), a URL (s3://bucket/prefix, gs://, az://, file:///path) "
                   "or a folder path; default: the journal's default remote")
    p = command("push", _verb("push"), "send what the journal recorded since its last push to a remote")
    p.add_argument("remote", nargs="?", metavar="REMOTE", help=remote_help)
    p.add_argument("--json", action="store_true", help="print the push report as JSON")
    p = command("pull", _verb("pull"), "bring the events and payloads pushed to a remote into the journal (writes)",
                journal=False)
    p.add_argument("remote", nargs="?", metavar="REMOTE", help=remote_help)
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    p.add_argument("--json", action="store_true", help="print the pull report as JSON")
    _merge_options(p)
    p = command("clone", _verb("clone"), "create the journal from everything pushed to URL; it names URL origin "
                "(writes)", journal=False)
    p.add_argument("url", metavar="URL", help="the remote: s3://bucket/prefix, gs://, az://, file:///path, a folder path, "
                   "or one of your own remote names (stepjournal remote add --global)")
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    p.add_argument("--json", action="store_true", help="print the pull report as JSON")
    _merge_options(p)
    p = command("status", _verb("status"), "what push would send to a remote and pull would fetch from it "
                "(sends and writes nothing)")
    p.add_argument("remote", nargs="?", metavar="REMOTE", help=remote_help)
    p.add_argument("--json", action="store_true", help="print the status as JSON")
    _remote_parser(sub, [late], _Parser)

    p = command("plugins", _verb("plugins"), "the installed policy plugins and whether each loads", journal=False)
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per plugin")
    p = command("report", _verb("report"), "write one self-contained HTML file of a run: charts per step, its "
                "samples decoded, a text search (docs/reading.md)")
    p.add_argument("-o", "--out", required=True, metavar="FILE.html", help="the HTML file to write")
    p.add_argument("--run", help="the run key (needed when the journal holds several)")
    p.add_argument("--tokenizer", metavar="PATH", help="the tokenizer folder (default: the one the run's fingerprint "
                   "names); loaded from local files only")
    p.add_argument("--no-text", action="store_true", help="no tokenizer: lengths and rewards only")
    p.add_argument("--samples", type=_nonneg_int, default=8, metavar="N", help="samples embedded per step (default 8)")
    p.add_argument("--chars", type=_nonneg_int, default=2000, metavar="N",
                   help="characters kept of each prompt and response (default 2000)")
    p = command("completion", _verb("completion"), "print the shell completion script: "
                'eval "$(stepjournal completion bash)" in ~/.bashrc', journal=False)
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell")

    from ._diff import add_parser as add_diff

    diff = add_diff(sub)
    diff.add_argument("-v", "--verbose", dest="verbose_late", action="count", default=0,
                      help="log more to stderr (-vv: debug)")
    for verb in (diff, sub.choices["remote"]):
        verb.epilog, verb.formatter_class = examples_text(verb.prog.split()[-1]), argparse.RawDescriptionHelpFormatter
    return parser


def _remote_parser(sub: Any, parents: list, parser_class: type) -> None:
    """The ``remote`` verb and its three sub-verbs, under `sub`."""
    p = sub.add_parser("remote", parents=parents, help="name the remotes of a journal: add, list, remove (writes "
                       "the journal folder's remotes.json)",
                       description="Name the remotes of a journal, so push, pull and status take a name (or nothing: "
                       "the default remote) instead of a URL. No credential is ever stored.")
    p.set_defaults(fn=_verb("remote"))
    verbs = p.add_subparsers(dest="remote_command", metavar="ACTION", parser_class=parser_class)
    verbs.required = True
    journal_help = "the journal folder (not with --global)"
    global_help = ("your own remotes (~/.config/stepjournal/remotes.json), which every journal of this machine and "
                   "`clone` see, instead of a journal's")
    add = verbs.add_parser("add", parents=parents, help="name a remote URL (or folder); the first one added is the default")
    add.add_argument("journal", metavar="JOURNAL", nargs="?", help=journal_help)
    add.add_argument("name", metavar="NAME", help="the remote's name (letters, digits, '-', '_')")
    add.add_argument("url", metavar="URL", help="s3://bucket/prefix, gs://, az://, file:///path, or a folder path; "
                     "no user info or password: credentials stay in the client's environment")
    add.add_argument("--default", action="store_true", help="make it the default remote")
    listed = verbs.add_parser("list", parents=parents, help="the journal's remotes (or yours: --global)")
    listed.add_argument("journal", metavar="JOURNAL", nargs="?", help=journal_help)
    listed.add_argument("--json", action="store_true", help="print a JSON array, one object per remote")
    remove = verbs.add_parser("remove", parents=parents, help="forget a remote (nothing on the remote changes)")
    remove.add_argument("journal", metavar="JOURNAL", nargs="?", help=journal_help)
    remove.add_argument("name", metavar="NAME", help="the remote's name")
    for verb in (add, listed, remove):
        verb.add_argument("--global", dest="user", action="store_true", help=global_help)


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
        status = _main(argv)
        sys.stdout.flush()  # a reader that went away shows here, not in an "Exception ignored" at exit
        return status
    except BrokenPipeError:
        _silence_stdout()
        return _BROKEN_PIPE_STATUS


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush does not fail a second time."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (called in-process with a captured stdout)
        pass


def _main(argv: Optional[List[str]]) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"stepjournal: error: {error_line(exc)}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0)
    journal = getattr(args, "journal", None)
    # The command line owns the library's log output while it runs; called in-process (tests,
    # notebooks) it hands the caller's logging configuration back afterwards.
    try:
        with console_logging(_log_level(args.verbose + args.verbose_late)), consoles() as (out, err):
            return args.fn(args, out, err)
    except BrokenPipeError:
        raise
    except UsageError as exc:
        print(f"stepjournal: error: {error_line(exc)}", file=sys.stderr)
        return 2
    except IntegrityError as exc:
        # An import's damage is in its bundle; a journal a failed verb created is gone (nothing to verify).
        checked = args.bundle if args.command == "import" else journal
        hint = "" if args.command == "verify" or checked is None or not os.path.exists(checked) else (
            f"; run `stepjournal verify {one_line(checked)}` for the full picture")
        print(f"stepjournal: error: {error_line(exc)}{hint}", file=sys.stderr)
        return 1
    except (Failure, StepJournalError, OSError) as exc:
        print(f"stepjournal: error: {error_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stepjournal: interrupted", file=sys.stderr)
        return 130
