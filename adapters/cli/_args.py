"""Argument pieces several verbs share: a whole-number type, the remote argument, the ways out of an
import conflict. Light on purpose: `_app` imports it to build the parser of ``stepjournal --help``."""

from __future__ import annotations

import argparse

__all__ = ["nonneg_int", "add_verbose_late", "add_remote_argument", "add_merge_options"]

REMOTE_HELP = ("a remote's name (stepjournal remote list; yours: remote list --global), a URL (s3://bucket/prefix, "
               "gs://, az://, file:///path) or a folder path; default: the journal's default remote")


_LARGEST = (1 << 63) - 1  # a step, a count, an index: what LMDB's keys and islice hold


def nonneg_int(text: str) -> int:
    """An argparse type: a whole number, 0 to 2**63-1."""
    shown = text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"
    if text.strip().isdigit() and len(text.strip()) > len(str(_LARGEST)):
        value = _LARGEST + 1  # int() refuses 4 300 digits and more
    else:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{shown!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{shown} is negative")
    if value > _LARGEST:
        raise argparse.ArgumentTypeError(f"{shown} is past the largest number taken (2**63-1)")
    return value


def add_verbose_late(p: argparse.ArgumentParser) -> None:
    """``-v`` after the verb too (``stepjournal audit J -v``), counted with the ones given before it."""
    p.add_argument("-v", "--verbose", dest="verbose_late", action="count", default=0,
                   help="log more to stderr (-vv: debug)")


def add_remote_argument(p: argparse.ArgumentParser) -> None:
    """The optional ``REMOTE`` of push, pull and status."""
    p.add_argument("remote", nargs="?", metavar="REMOTE", help=REMOTE_HELP)


def _run_keys(value: str) -> str:
    """``--as``'s value, NEW or OLD=NEW, each a run key a journal can hold (as ``--run``'s `key_word`)."""
    from ._common import key_word  # when a command line is parsed, not when --help is built

    for key in value.split("=", 1):
        key_word("run")(key)
    return value


def add_merge_options(p: argparse.ArgumentParser) -> None:
    """The ways out of an import conflict (docs/sharing.md, "When records conflict")."""
    p.add_argument("--as", dest="runs_as", action="append", metavar="NEW|OLD=NEW", type=_run_keys,
                   help="import under another run key: NEW for every incoming run, or OLD=NEW (repeat for several)")
    p.add_argument("--keep", choices=["ours"], help="ours: where an incoming record differs from one this journal "
                   "serves, import it for the audit and keep serving this journal's")
