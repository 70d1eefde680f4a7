"""``stepjournal prune``: release the payloads of recorded steps that retention rules do not keep (writes).

Events stay: each released record gets a `PayloadsReleased` event, committed with the deletion, and
`audit`, `show` and `timeline` show it. Disk space comes back with ``stepjournal compact``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, List, Optional

from rich.console import Console

from stepjournal import Journal
from stepjournal.errors import RetentionError, StepJournalError
from stepjournal.events import AUDIT_SCHEMA_VERSION
from stepjournal.upkeep import Retention, prune
from stepjournal.policies import StepRanges

from ._args import nonneg_int
from ._common import key_word
from ._render import Failure, UsageError, cell, clean, human_size, print_json, print_line

__all__ = ["add_arguments", "run", "rules_from_args"]


def rules_from_args(args: argparse.Namespace) -> Optional[Retention]:
    """The `Retention` the command line asks for (None: no rule, only leftovers); a bad value is a usage
    error naming it."""
    if args.keep_last is None and args.max_bytes is None:
        given = [flag for flag, value in (("--pin", args.pin), ("--run", args.run), ("--mode", args.mode),
                                          ("--stage", args.stage), ("--all", args.all),
                                          ("--no-keep-replayed", args.no_keep_replayed)) if value]
        if given:
            raise UsageError(f"{', '.join(given)} needs --keep-last N and/or --max-bytes SIZE; without a rule, "
                             "prune releases nothing and deletes only bytes earlier releases left stored")
        return None
    try:
        pin = StepRanges.parse(args.pin) if args.pin else None
    except StepJournalError as exc:
        raise UsageError(f"--pin: {str(exc).splitlines()[0]}") from None
    try:
        return Retention(
            keep_last=args.keep_last, pin=pin, keep_replayed=not args.no_keep_replayed,
            max_bytes=args.max_bytes, run=args.run, mode=args.mode, stage=args.stage, allow_release_all=args.all,
        )
    except RetentionError as exc:
        raise UsageError(cli_words(exc, args)) from None


# The arguments of `Retention` as this command's flags (a flag that takes no value drops the value shown).
_FLAGS = {"keep_last": "--keep-last", "max_bytes": "--max-bytes", "pin": "--pin", "allow_release_all": "--all",
          "run": "--run", "mode": "--mode", "stage": "--stage"}
_SWITCHES = frozenset({"--all"})


def _flag_words(name: str, value: Any) -> str:
    flag = _FLAGS.get(name, name)
    return flag if value is None or flag in _SWITCHES else f"{flag} {RetentionError.shown(value)}"


def cli_words(exc: RetentionError, args: argparse.Namespace) -> str:
    """A retention error in this command's words (``--keep-last 2``), from its typed parts (`RetentionError.words`):
    the Python words of its message (``keep_last=2``) are never rewritten."""
    text = exc.words(_flag_words)
    return text if exc.rule is None else f"retention {' '.join(_flags(args))} {text}"


def _flags(args: argparse.Namespace) -> List[str]:
    """The rule's flags as the command line gave them."""
    flags = [f"{flag} {cell(value)}" for flag, value in (
        ("--keep-last", args.keep_last), ("--max-bytes", args.max_bytes), ("--pin", args.pin), ("--run", args.run),
        ("--mode", args.mode), ("--stage", args.stage)) if value is not None]
    return flags + [flag for flag, on in (("--no-keep-replayed", args.no_keep_replayed), ("--all", args.all)) if on]


def _rule_words(args: argparse.Namespace, rules: Optional[Retention]) -> str:
    """The rule as the command line gave it (its flags), not as Python spells it."""
    if rules is None:
        return "with no rule (only the bytes earlier releases left stored)"
    return "under " + " ".join(_flags(args))


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``stepjournal prune``."""
    p.add_argument("journal", metavar="JOURNAL", help="the journal folder")
    p.add_argument("--keep-last", type=nonneg_int, metavar="N",
                   help="keep the N largest recorded steps of each run and mode")
    p.add_argument("--pin", metavar="RANGES", help="always keep these steps, e.g. '1-5,100'")
    p.add_argument("--max-bytes", metavar="SIZE",
                   help="cap each run and mode's stored bytes, e.g. 10G (smallest steps go first)")
    p.add_argument("--run", type=key_word("run"), help="only this run key (default: every run)")
    p.add_argument("--mode", type=key_word("mode"), help="only this mode (default: every mode)")
    p.add_argument("--stage", type=key_word("stage"),
                   help="only this stage (default: every stage, each kept on its own)")
    p.add_argument("--no-keep-replayed", action="store_true", help="release steps a session replayed from too")
    p.add_argument("--all", action="store_true", help="allow releasing every step of a run and mode")
    p.add_argument("--dry-run", action="store_true", help="say what would go; change nothing")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    rules = rules_from_args(args)
    if not os.path.isfile(os.path.join(args.journal, "data.mdb")):
        raise Failure(f"no journal at {clean(args.journal)!r}: the folder or its data.mdb is missing")
    # Maintenance records no calls, so it opens no session (as reindex).
    with Journal(args.journal, session=False) as journal:
        # Every run's calls follow its session's opening (an import brings the sessions it imports).
        if args.run is not None and args.run not in {opened.run for _, opened in journal.sessions()}:
            raise Failure(f"no run {clean(args.run)!r} in {clean(args.journal)!r}; `stepjournal runs` lists its runs")
        try:
            plan = prune(journal, rules, dry_run=args.dry_run)
        except RetentionError as exc:
            raise Failure(cli_words(exc, args)) from None
        except StepJournalError as exc:
            raise Failure(str(exc)) from None
    if args.json:
        print_json({
            "schema_version": AUDIT_SCHEMA_VERSION, "dry_run": args.dry_run, "rule": plan.rule,
            "released_bytes": plan.released_bytes,
            "leftover": list(plan.leftover),
            "kept_steps": [{"run": g[0], "mode": g[1], "stage": g[2], "steps": n}
                           for g, n in sorted(plan.kept_steps.items())],
            "releases": [{"record_seq": r.record_seq, "run": r.run, "mode": r.mode, "stage": r.stage, "step": r.step,
                          "gen_index": r.gen_index, "released": list(r.released), "retained": list(r.retained),
                          "reason": r.reason} for r in plan.releases],
        })
        return 0
    verb = "would release" if args.dry_run else "released"
    steps = sorted({(r.run, r.mode, r.stage, r.step) for r in plan.releases})
    print_line(out, f"{verb} {len(plan.releases)} records of {len(steps)} steps ({human_size(plan.released_bytes)}) "
                    f"in {cell(args.journal)} {_rule_words(args, rules)}")
    for (run_key, mode, stage), kept in sorted(plan.kept_steps.items()):
        gone = StepRanges.from_steps([s for r, m, g, s in steps if (r, m, g) == (run_key, mode, stage)])
        where = f"{cell(mode)}" if stage == "generate" else f"{cell(mode)} stage {cell(stage)}"
        out.print(f"  run {cell(run_key)} {where}: {kept} steps kept; released steps {str(gone) or 'none'}")
    if plan.leftover:
        out.print(f"  {len(plan.leftover)} payloads an earlier prune released were still stored: "
                  f"{'would be ' if args.dry_run else ''}deleted")
    if not args.dry_run and plan.releases:
        out.print("disk space comes back with `stepjournal compact`")
    return 0
