"""``stepjournal import FILE JOURNAL``: bring a bundle's events and payloads into a journal."""

from __future__ import annotations

import argparse

from rich.console import Console

from stepjournal import import_bundle

from ._pull import merge_options, pulled

__all__ = ["run"]


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    options = merge_options(args)
    return pulled(args, out, err, lambda progress: import_bundle(args.bundle, args.journal, progress=progress, **options))
