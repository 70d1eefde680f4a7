"""``stepjournal export``: recorded payloads as safetensors + JSON, through `stepjournal.export_payloads`."""

from __future__ import annotations

import argparse
import os

from rich.console import Console

from stepjournal import export_payloads
from stepjournal.policies import StepRanges

from ._common import parse_steps
from ._render import Failure, cell, progress_bar

__all__ = ["run"]


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    steps = parse_steps(args.steps) or StepRanges.every()
    try:
        import safetensors.torch  # noqa: F401  (fail before a progress bar is drawn)
    except ImportError:
        raise Failure("export needs safetensors: pip install 'stepjournal[export]'") from None
    with progress_bar(err) as progress:
        task = progress.add_task("exporting", total=None)
        manifest = export_payloads(
            args.journal,
            args.to,
            run=args.run,
            mode=args.mode,
            steps=steps,
            inputs=args.inputs,
            progress=lambda done, total: progress.update(task, completed=done, total=total),
        )
    count = len(manifest["entries"])
    out.print(f"exported {count} recorded output{'s' * (count != 1)} of run {cell(manifest['run'])} "
              f"to {cell(os.path.abspath(args.to))}")
    return 0
