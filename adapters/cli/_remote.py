"""``stepjournal remote add|list|remove JOURNAL ...``: the journal's named remotes, or with ``--global`` your
own, which every journal and ``clone`` see (docs/sharing.md)."""

from __future__ import annotations

import argparse

import attrs
from rich.console import Console
from rich.table import Table

from stepjournal.sharing import add_remote, list_remotes, redact, remove_remote

from ._args import add_verbose_late
from ._render import UsageError, cell, print_json, print_line

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal remote``: its three actions, each with its own."""
    p.description = ("Name the remotes of a journal, so push, pull and status take a name (or nothing: the default "
                     "remote) instead of a URL. No credential is ever stored.")
    verbs = p.add_subparsers(dest="remote_command", metavar="ACTION", parser_class=type(p))
    verbs.required = True
    journal_help = "the journal folder (not with --global)"
    global_help = ("your own remotes (~/.config/stepjournal/remotes.json), which every journal of this machine and "
                   "`clone` see, instead of a journal's")
    add = verbs.add_parser("add", help="name a remote URL (or folder); the first one added is the default")
    add.add_argument("journal", metavar="JOURNAL", nargs="?", help=journal_help)
    add.add_argument("name", metavar="NAME", help="the remote's name (letters, digits, '-', '_')")
    add.add_argument("url", metavar="URL", help="s3://bucket/prefix, gs://, az://, file:///path, or a folder path; "
                     "no user info or password: credentials stay in the client's environment")
    add.add_argument("--default", action="store_true", help="make it the default remote")
    listed = verbs.add_parser("list", help="the journal's remotes (or yours: --global)")
    listed.add_argument("journal", metavar="JOURNAL", nargs="?", help=journal_help)
    listed.add_argument("--json", action="store_true", help="print a JSON array, one object per remote")
    remove = verbs.add_parser("remove", help="forget a remote (nothing on the remote changes)")
    remove.add_argument("journal", metavar="JOURNAL", nargs="?", help=journal_help)
    remove.add_argument("name", metavar="NAME", help="the remote's name")
    for verb in (add, listed, remove):
        verb.add_argument("--global", dest="user", action="store_true", help=global_help)
        add_verbose_late(verb)


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.user and args.journal is not None:
        raise UsageError(f"--global names your own remotes, not journal {args.journal}'s: give one of them")
    if not args.user and args.journal is None:
        raise UsageError("give the JOURNAL whose remotes these are, or --global for your own")
    where = None if args.user else args.journal
    if args.remote_command == "add":
        added = add_remote(where, args.name, args.url, default=args.default)
        default = " (the default)" if added.default else ""
        print_line(out, f"remote {cell(added.name)} is {cell(redact(added.url))}{default}")
    elif args.remote_command == "remove":
        removed = remove_remote(where, args.name)
        print_line(out, f"removed remote {cell(removed.name)} ({cell(redact(removed.url))})")
    elif args.json:
        print_json([attrs.asdict(r) for r in list_remotes(where)])
    else:
        remotes = list_remotes(where)
        if not remotes:
            out.print("you have no remotes of your own (stepjournal remote add --global NAME URL)" if args.user else
                      f"journal {cell(args.journal)} has no remotes (stepjournal remote add JOURNAL NAME URL)")
            return 0
        table = Table(box=None, pad_edge=False)
        for column in ("name", "url", "default"):
            table.add_column(column)
        for r in remotes:
            table.add_row(cell(r.name), cell(redact(r.url)), "yes" if r.default else "")
        out.print(table)
    return 0
