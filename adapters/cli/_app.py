"""The `stepjournal` command line: look into a journal, check it, export it, draw it, rebuild its index.

Every command but `reindex`, `prune`, `compact`, `import-verl`, `import`, `pull`, `clone` and `remote add|remove`
(which writes the folder's remotes.json, not the journal's data) opens the journal read-only: it changes no byte of the
journal's data, works while a trainer is writing to it, and works on a copy in a read-only place.
Tables and progress go through rich (progress on stderr); ``--json`` and ``--csv`` print plain
machine-readable text. Errors print one line, ``stepjournal: error: ...``: exit status 2 for bad
arguments, 1 for failures.

This module holds the parser and `main`; each verb is a module of this package (`VERBS` names them)
holding its own arguments (``add_arguments``) and ``run``, imported only when its verb runs (the
parser of ``stepjournal --help`` imports none; ``_examples`` holds the examples that end each verb's
help), so ``stepjournal --help`` loads no table, tensor or plotting code of its own. Like other Unix tools it
stops quietly when the reader of its output goes away (``stepjournal audit J --csv | head -1``): no message,
exit status 141.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import Any, Callable, Collection, Dict, List, Optional, Tuple

import stepjournal
from stepjournal.errors import IntegrityError, StepJournalError
from stepjournal.log import console_logging

from ._args import add_verbose_late
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
# The verbs, in the order ``--help`` lists them: name -> (module, what it does). Each module holds its
# own arguments (``add_arguments(p)``) and ``run``: a new verb is its module and one line here.
VERBS: Dict[str, Tuple[str, str]] = {
    "runs": ("runs", "run keys, sessions, fingerprints and call counts"),
    "audit": ("audit", "one row per generate call, in log order"),
    "show": ("show", "the structure of a recorded payload: keys, dtypes, shapes, first values"),
    "verify": ("verify", "re-hash every payload, decode every event, check the index (JOURNAL may be a bundle "
               "file: checked without importing it)"),
    "export": ("export", "write recorded payloads as safetensors + JSON, a portable bundle, or TensorBoard event "
               "files"),
    "import": ("import", "bring a bundle's events and payloads into a journal (writes)"),
    "timeline": ("timeline", "draw the run: a column per step, replays linked to their source"),
    "reindex": ("reindex", "rebuild the index (a projection) from the event log; writes to the journal"),
    "prune": ("prune", "release the payloads of steps retention rules do not keep; events stay (writes)"),
    "compact": ("compact", "write a compacted copy and swap it in, so freed space returns to the disk (writes)"),
    "import-verl": ("import_verl", "import verl RolloutSkip / SkipManager dumps into a journal (writes)"),
    "verl-config": ("verl_config",
                    "print the quoted overrides and YAML that move a verl config's rollout skip to stepjournal"),
    "push": ("push", "send what the journal recorded since its last push to a remote"),
    "pull": ("pull", "bring the events and payloads pushed to a remote into the journal (writes)"),
    "clone": ("clone", "create the journal from everything pushed to URL; it names URL origin (writes)"),
    "status": ("status", "what push would send to a remote and pull would fetch from it (sends and writes nothing)"),
    "remote": ("remote", "name the remotes of a journal: add, list, remove (writes the journal folder's "
               "remotes.json)"),
    "plugins": ("plugins", "the installed policy plugins and whether each loads"),
    "report": ("report", "write one self-contained HTML file of a run or session: charts per step, its samples "
               "decoded, a text search (docs/reading.md)"),
    "completion": ("completion", 'print the shell completion script: eval "$(stepjournal completion bash)" in '
                   "~/.bashrc"),
    "diff": ("diff", "where two runs part: the first differing step, stage and sample"),
}


def build_parser(verbs: Optional[Collection[str]] = None) -> _Parser:
    """The command line's parser. `verbs`: only those verbs' modules are imported to add their arguments
    (the one being run; none for ``stepjournal --help``); None: every verb's (shell completion, tests)."""
    parser = _Parser(
        prog="stepjournal",
        description="Inspect, check, export, draw and share stepjournal journals (read-only, except reindex, prune, "
        "compact, import-verl, import, pull and clone).",
    )
    parser.add_argument("--version", action="version", version=f"stepjournal {stepjournal.__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more to stderr (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (module, help) in VERBS.items():
        p = sub.add_parser(name, help=help, description=help, epilog=examples_text(name),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        add_verbose_late(p)
        p.set_defaults(fn=_verb(module))
        if verbs is None or name in verbs:
            importlib.import_module(f"{__package__}._{module}").add_arguments(p)
    return parser


def _verbs_in(argv: List[str]) -> List[str]:
    """The verb `argv` names, if any: its first word that is not an option (global options take no value)."""
    return [word for word in argv if not word.startswith("-")][:1]


def _unknown_verb(word: str) -> UsageError:
    """The error for a command line whose verb is `word`, not one of `VERBS`: the nearest verbs (as git's
    ``did you mean``), else the list."""
    import difflib

    near = difflib.get_close_matches(word, list(VERBS), n=3, cutoff=0.6)
    hint = f" (did you mean {' or '.join(map(repr, near))}?)" if near else f"; the commands: {', '.join(VERBS)}"
    return UsageError(f"unknown command {one_line(word)!r}{hint}")


def _log_level(verbosity: int) -> int:
    return {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line; return the exit status (0 ok, 1 failure or damage found, 2 bad arguments)."""
    if os.environ.get("_ARGCOMPLETE"):  # a Tab of `stepjournal completion`'s script: answer it and exit
        from ._completion import complete

        complete(build_parser)
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
        words = sys.argv[1:] if argv is None else list(argv)
        verbs = _verbs_in(words)
        if verbs and verbs[0] not in VERBS:
            raise _unknown_verb(verbs[0])
        args = build_parser(verbs).parse_args(words)
    except UsageError as exc:
        print(f"stepjournal: error: {error_line(exc)}", file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help and --version
        return int(exc.code or 0)
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
        journal = getattr(args, "journal", None)  # as the verb read it (pull takes its two words in either order)
        # An import's damage is in its bundle; a journal a failed verb created is gone (nothing to verify).
        checked = args.bundle if args.command == "import" else journal
        hint = "" if args.command == "verify" or checked is None or not os.path.exists(checked) else (
            f"; run `stepjournal verify {one_line(checked)}` for the full picture")
        print(f"stepjournal: error: {error_line(exc)}{hint}", file=sys.stderr)
        return 1
    except (Failure, StepJournalError, OSError) as exc:
        print(f"stepjournal: error: {error_line(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        # A verb that resumes (push, pull, clone) says how, in the interrupt it raises again.
        print(f"stepjournal: interrupted{f'; {one_line(exc)}' if str(exc) else ''}", file=sys.stderr)
        return 130
