"""``stepjournal remote add|list|remove JOURNAL ...``: the journal's named remotes, or with ``--global`` your
own, which every journal and ``clone`` see (docs/sharing.md)."""

from __future__ import annotations

import argparse

import attrs
from rich.console import Console
from rich.table import Table

from stepjournal import add_remote, list_remotes, redact, remove_remote

from ._render import UsageError, cell, print_json

__all__ = ["run"]


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.user and args.journal is not None:
        raise UsageError(f"--global names your own remotes, not journal {args.journal}'s: give one of them")
    if not args.user and args.journal is None:
        raise UsageError("give the JOURNAL whose remotes these are, or --global for your own")
    where = None if args.user else args.journal
    if args.remote_command == "add":
        added = add_remote(where, args.name, args.url, default=args.default)
        out.print(f"remote {cell(added.name)} is {cell(redact(added.url))}" + (" (the default)" if added.default else ""))
    elif args.remote_command == "remove":
        removed = remove_remote(where, args.name)
        out.print(f"removed remote {cell(removed.name)} ({cell(redact(removed.url))})")
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
