"""``stepjournal plugins``: the installed policy plugins (docs/plugins.md) and whether each loads."""

from __future__ import annotations

import argparse

from rich.console import Console

from stepjournal.events import AUDIT_SCHEMA_VERSION
from stepjournal.policies import plugin_report

from ._render import cell, print_json

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal plugins``."""
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per plugin")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """List every installed plugin (importing each, as a spec naming it would); exit 1 when one fails."""
    report = plugin_report()
    if args.json:
        print_json([
            {"schema_version": AUDIT_SCHEMA_VERSION, "name": p.name, "target": p.target,
             "distribution": p.distribution, "version": p.version, "loads": p.loads, "error": p.error,
             "shadowed": p.shadowed}
            for p in report
        ])
        return 0 if all(p.loads for p in report) else 1
    if not report:
        out.print("no policy plugins installed (entry point group stepjournal.policies)")
        return 0
    from rich.table import Table

    table = Table(title="policy plugins", title_justify="left")
    for column in ("name", "target", "distribution", "loads", "error"):
        table.add_column(column, overflow="fold")
    for p in report:
        loads = "[green]yes[/]" if p.loads else "[red]no[/]"
        name = cell(p.name) + (" [yellow](shadows a built-in)[/]" if p.shadowed else "")
        dist = cell(f"{p.distribution or '?'} {p.version or ''}".strip())
        table.add_row(name, cell(p.target), dist, loads, cell(p.error or ""))
    out.print(table)
    return 0 if all(p.loads for p in report) else 1
