"""``stepjournal import-verl``: verl's RolloutSkip / SkipManager / V1 skip.rollout_tq dumps into a journal.

docs/verl.md, "Importing verl's dumps".
"""

from __future__ import annotations

import argparse
from typing import Any, Optional

from rich.console import Console
from rich.table import Table

from stepjournal.events import AUDIT_SCHEMA_VERSION

from ._progress import progress_bar
from ._render import Failure, cell, print_json, print_line

__all__ = ["add_arguments", "run"]


def _run_config(path: Optional[str]) -> Any:
    """The verl config `--config` names (YAML, read by OmegaConf), or None."""
    if path is None:
        return None
    from omegaconf import OmegaConf

    try:
        return OmegaConf.load(path)
    except Exception as exc:  # a missing file or YAML that does not parse: say which
        raise Failure(f"--config {path!r} cannot be read as a verl config: {exc}") from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal import-verl``."""
    p.description = ("Import verl RolloutSkip (v1, v2), SkipManager and V1 skip.rollout_tq dump folders into a "
                     "journal, keeping their steps; records are marked as imported. The dumps are Python pickles: "
                     "nothing is loaded without --trust-pickle.")
    p.add_argument("dump_dir", metavar="DUMP_DIR", help="verl's skip dump_dir, or a folder below it")
    p.add_argument("--into", dest="journal", required=True, metavar="JOURNAL",
                   help="the journal folder to write into (created when missing)")
    p.add_argument("--trust-pickle", action="store_true",
                   help="load the dumps although they are pickles "
                        "(only for dumps you made, in a folder only you write)")
    p.add_argument("--config", metavar="YAML", default=None,
                   help="the verl config of the run that wrote the dumps (e.g. its .hydra/config.yaml): its model, "
                   "sampling settings and train files join the records' fingerprint")
    p.add_argument("--json", action="store_true", help="print the import report as JSON")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    """Import verl RolloutSkip / SkipManager dump folders into a journal (writes to it; docs/verl.md)."""
    try:
        from stepjournal.adapters.verl import import_verl_dumps
    except ImportError as exc:
        raise Failure(f"import-verl needs verl ({exc}): in a clone of stepjournal, pip install -e '.[verl]'") from None
    if not args.trust_pickle:
        # Refuses, saying why, before any dump is read and before a progress bar is drawn.
        import_verl_dumps(args.dump_dir, args.journal, trust_pickle=False)
    with progress_bar(err, quiet=args.json) as progress:
        task = progress.add_task("importing verl dumps", total=None)
        report = import_verl_dumps(
            args.dump_dir,
            args.journal,
            trust_pickle=True,
            config=_run_config(args.config),
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, **report.to_json()})
        return 0 if report.ok else 1
    print_line(out, f"imported into {cell(report.journal)}")
    table = Table()
    for column in ("run", "step", "index", "form", "input", "source"):
        table.add_column(column)
    for row in report.imported:
        table.add_row(cell(row.run), str(row.step), str(row.gen_index), row.form,
                      "yes" if row.stored_input else "no", cell(row.source))
    out.print(table)
    for skipped in report.skipped:
        err.print(f"[yellow]skipped[/] {cell(skipped.source)}: {cell(skipped.reason)}")
    for failed in report.failed:
        err.print(f"[red]failed[/] {cell(failed.source)}: {cell(failed.reason)}")
    out.print(f"{len(report.imported)} imported, {len(report.skipped)} skipped, {len(report.failed)} failed")
    return 0 if report.ok else 1
