"""``stepjournal show JOURNAL STEP --text``: each sample of a generate call, decoded with the run's tokenizer,
beside its reward and log-prob.

The tokenizer is the one the run kept in the journal (`stepjournal.adapters.record_tokenizer`; loaded as data
by the ``tokenizers`` library, never as code), or ``--tokenizer PATH``; for a journal recorded before
tokenizers were kept, the first of `tokenizer_keys` the fingerprint names (TRL's ``tokenizer``; verl's
tokenizer path, else its model path). A folder is loaded from local files only (``transformers``'
`AutoTokenizer`, offline), with remote code refused: reading a journal never reaches the network and never
runs code. Without a tokenizer the samples' token ids are shown, with one line saying how to get text.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Optional, Sequence, Tuple

from rich.console import Console

from stepjournal import Journal
from stepjournal.events import AUDIT_SCHEMA_VERSION
from stepjournal.vocabulary import Action

from .._tokenizer import TokenizerDocumentError, journal_tokenizer
from .._tokenizer_keys import TOKENIZER_KEY, VERL_TOKENIZER_KEYS
from ._common import choose_run
from ._preview import inline
from ._show_light import light_load
from ._render import Failure, cell, clean, one_line, print_json, print_line

__all__ = ["run", "load_tokenizer", "note_to", "tokenizer_keys", "NO_TEXT_HINT"]


def tokenizer_keys() -> Tuple[str, ...]:
    """The fingerprint keys that name a run's tokenizer, first found wins: ``tokenizer`` (TRL's, and the one to use
    in a fingerprint of your own), then verl's (`stepjournal.adapters._tokenizer_keys`: read without importing verl)."""
    return (TOKENIZER_KEY,) + VERL_TOKENIZER_KEYS


def _named(fingerprints: Sequence[Any], keys: Sequence[str]) -> Optional[str]:
    """The tokenizer the latest of `fingerprints` to name one names, under the first of `keys` it holds."""
    path = None
    for fingerprint in fingerprints:
        named = (fingerprint[k] for k in keys if isinstance(fingerprint.get(k), str) and fingerprint[k])
        path = next(named, None) or path
    return path


NO_TEXT_HINT = "run {run!r} kept no tokenizer, so ids are shown; for text see docs/reading.md"  # fits 80 columns


def load_tokenizer(journal: Journal, run: str, given: Optional[str],
                   note: Optional[Callable[[str], None]] = None) -> Any:
    """The tokenizer to decode `run`'s calls with, or None (token ids are shown, and `note` gets one line saying
    how to get text): `--tokenizer`'s folder; else the one the run kept in the journal (loaded as data,
    `journal_tokenizer`); else, for a journal recorded before tokenizers were kept, the folder or cached hub
    name the run's fingerprint names (`tokenizer_keys`), from local files. Only a `--tokenizer` that does not
    load is an error."""
    if given:
        return _from_files(given)
    try:
        stored = journal_tokenizer(journal, run, load=light_load(journal))
    except TokenizerDocumentError as exc:  # refused, never loaded: the ids are still worth reading
        _note(note, f"{exc}; token ids shown (for text pass --tokenizer PATH)")
        return None
    if stored is not None:
        return stored
    fingerprints = [opened.fingerprint for _, opened in journal.sessions(run=run)]  # the log read once
    path = _named(fingerprints, (TOKENIZER_KEY,)) or _named(fingerprints, tokenizer_keys())
    if path:
        try:
            return _from_files(path)
        except Failure as exc:
            _note(note, f"{exc}; token ids shown")
            return None
    _note(note, NO_TEXT_HINT.format(run=run))
    return None


def _note(note: Optional[Callable[[str], None]], text: str) -> None:
    if note is not None:
        note(one_line(text))


def note_to(err: Console) -> Callable[[str], None]:
    """`load_tokenizer`'s `note`, printed on `err` as one line."""
    return lambda text: print_line(err, f"[yellow]{cell(text)}[/]")


def _from_files(path: str) -> Any:
    """The tokenizer saved in the folder `path` (or a hub name the local cache holds), from local files only."""
    if (os.path.isabs(path) or path.startswith(("./", "../"))) and not os.path.exists(path):
        # A path (not a hub name, which the local cache may hold) that is not there: said before transformers loads.
        raise Failure(f"cannot load the tokenizer {clean(path)!r} from local files (no such file or folder); pass "
                      "--tokenizer PATH, a folder its tokenizer was saved to")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a journal is read offline: never fetch a tokenizer
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise Failure("decoding with a tokenizer folder needs transformers: pip install transformers") from None
    try:
        # A tokenizer folder is the journal's word: code it names (auto_map) never runs, and nothing asks
        # whether it may (transformers prompts on stdin when trust_remote_code is left unset).
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Failure(f"cannot load the tokenizer {clean(path)!r} from local files ({clean(first)}); pass --tokenizer "
                      "PATH, a folder its tokenizer was saved to") from None


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from stepjournal.tools import samples  # here, with numpy: building the parser imports neither

    with Journal(args.journal, readonly=True) as journal:
        run_key = choose_run(journal, args.run)
        notes: list = []  # said once the samples are read: an error stays the one line it is
        tokenizer = load_tokenizer(journal, run_key, args.tokenizer, notes.append)
        # Plain payloads read with msgpack and numpy (`light_load`): no torch, when the payloads allow it.
        found = samples(journal, args.step, run=run_key, mode=args.mode, gen_index=args.index, tokenizer=tokenizer,
                        load=light_load(journal))
    for note in notes:
        note_to(err)(note)
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, "run": run_key, "step": args.step,
                    "samples": [s.to_json() for s in found]})
        return 0
    from ._pager import paged

    with paged(out, enabled=not args.no_pager) as page:
        _print_samples(page, args, run_key, found)
    return 0


def _print_samples(out: Console, args: argparse.Namespace, run_key: str, found: Sequence[Any]) -> None:
    first = found[0] if found else None
    served = "generated"
    if first is not None and first.action == Action.REPLAYED:
        served = (f"replayed from step {first.source_step} call #{first.source_gen_index} "
                  f"of run {cell(first.source_run)}")
    out.print(f"[bold]run {cell(run_key)} · {cell(args.mode)} · step {args.step} · call #{args.index}[/] · "
              f"{served} · {len(found)} samples")
    for s in found:
        facts = [f"{s.response_length} tokens" + (" (truncated)" if s.truncated else "")]
        facts += [f"{cell(stage)} {value:g}" for stage, value in s.rewards.items()]
        if s.logprob_mean is not None:
            facts.append(f"log-prob mean {s.logprob_mean:.4f}")
        out.print(f"[bold]sample {s.index}[/] · {' · '.join(facts)}")
        # Without a tokenizer, the ids: inline, as torch prints a tensor (`_preview`)
        prompt = cell(s.prompt) if s.prompt is not None else f"[dim]ids[/] {inline(s.prompt_ids)}"
        response = cell(s.response) if s.response is not None else f"[dim]ids[/] {inline(s.response_ids)}"
        out.print(f"  [dim]prompt:[/]   {prompt}")
        out.print(f"  [dim]response:[/] {response}")
