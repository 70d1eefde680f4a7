"""``stepjournal completion bash|zsh``: shell completion through argcomplete, from the parser itself.

The script (argcomplete's, for bash and zsh natively) runs ``stepjournal`` with ``_ARGCOMPLETE`` set at each
Tab; `main` hands such a run to `complete` before anything else. argcomplete completes the verbs, each
verb's options and their choices from the parser; `_values` completes what the parser cannot know, from
the journal named on the line: run keys for ``--run`` (``--run-a``, ``--run-b``: from journal A or B) and
session names (``s1``, ``s2`` ...) for ``--session`` (``--session-a``, ``--session-b``). Those never complete
file names, nor anything when the journal is not there yet. Other words complete file names. Install it
with one line (docs/audit.md): ``eval "$(stepjournal completion bash)"`` in ``~/.bashrc`` (or ``zsh`` in
``~/.zshrc``).
"""

from __future__ import annotations

import argparse
import os
from typing import Any, List

from rich.console import Console

__all__ = ["add_arguments", "run", "script", "complete", "COMPLETING"]

COMPLETING = "_ARGCOMPLETE"  # set by the script on each Tab: this run completes the line, nothing else
# An option's dest -> the dest of the journal whose run keys (sessions) it takes.
_RUNS = {"run": "journal", "run_a": "journal_a", "run_b": "journal_b"}
_SESSIONS = {"session": "journal", "session_a": "journal_a", "session_b": "journal_b"}


def script(shell: str) -> str:
    """The completion script for `shell` (``bash`` or ``zsh``): argcomplete's, without the shell's fallback to
    file names (an empty answer for ``--session-a`` stays empty)."""
    import argcomplete

    return argcomplete.shellcode(["stepjournal"], shell=shell, use_defaults=False)


def _journal_values(path: Any, sessions: bool) -> List[str]:
    """The run keys of the journal at `path` (`sessions`: its session names), read-only; none when it is not
    a journal (completion says nothing rather than fail)."""
    if not isinstance(path, str) or not os.path.isfile(os.path.join(path, "data.mdb")):
        return []
    from stepjournal import Journal
    from stepjournal.errors import StepJournalError
    from stepjournal.index import session_names

    try:
        with Journal(path, readonly=True) as journal:
            summaries = journal.run_summaries()
    except (StepJournalError, OSError):
        return []
    if not sessions:
        return [s.run for s in summaries]
    opened = sorted((seq, event.session) for s in summaries for seq, event in s.sessions)
    return list(session_names(session for _seq, session in opened).values())


def _values(prefix: str, action: argparse.Action, parser: argparse.ArgumentParser, parsed_args: argparse.Namespace,
            **_: Any) -> List[str]:
    """What a word of `action` can be (argcomplete's default completer): run keys and session names from the
    journal on the line for those options, file names for the rest."""
    for table, sessions in ((_RUNS, False), (_SESSIONS, True)):
        if action.dest in table:
            return _journal_values(getattr(parsed_args, table[action.dest], None), sessions)
    from argcomplete.completers import FilesCompleter

    return list(FilesCompleter()(prefix=prefix))


def complete(parser_of: Any) -> None:
    """Answer the completion the script asked for (``_ARGCOMPLETE`` set) and exit; `parser_of()` builds the
    whole parser (every verb's arguments)."""
    import argcomplete
    from argcomplete.completers import BaseCompleter

    class JournalValues(BaseCompleter):
        """`_values` in the shape argcomplete declares its completers (imported here: only a Tab needs it)."""

        def __call__(self, *, prefix: str, action: argparse.Action, parser: argparse.ArgumentParser,
                     parsed_args: argparse.Namespace) -> List[str]:
            return _values(prefix, action, parser, parsed_args)

    argcomplete.autocomplete(parser_of(), default_completer=JournalValues(), always_complete_options=False)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal completion``."""
    p.add_argument("shell", choices=("bash", "zsh"), help="the shell")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    import sys

    sys.stdout.write(script(args.shell))
    return 0
