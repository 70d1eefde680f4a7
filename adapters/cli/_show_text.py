"""``stepjournal show JOURNAL STEP --text``: each sample of a generate call, decoded with the run's tokenizer,
beside its reward and log-prob.

The tokenizer is the run's own: the first of `tokenizer_keys` the fingerprint the recording session opened
with names (TRL's ``tokenizer``; verl's tokenizer path, else its model path), or ``--tokenizer PATH``. It is
loaded from local files only (``transformers``' `AutoTokenizer`, offline), with remote code refused: reading a
journal never reaches the network and never runs code the tokenizer folder names.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Optional, Sequence, Tuple

from rich.console import Console

from stepjournal import AUDIT_SCHEMA_VERSION, Journal

from .._tokenizer_keys import TOKENIZER_KEY, VERL_TOKENIZER_KEYS
from ._common import choose_run
from ._render import Failure, cell, clean, print_json

__all__ = ["run", "load_tokenizer", "tokenizer_keys"]


def tokenizer_keys() -> Tuple[str, ...]:
    """The fingerprint keys that name a run's tokenizer, first found wins: ``tokenizer`` (TRL's, and the one to use
    in a fingerprint of your own), then verl's (`stepjournal.adapters._tokenizer_keys`: read without importing verl)."""
    return (TOKENIZER_KEY,) + VERL_TOKENIZER_KEYS


def _named(fingerprints: Sequence[Any], keys: Sequence[str]) -> Optional[str]:
    """The tokenizer the latest of `fingerprints` to name one names, under the first of `keys` it holds."""
    path = None
    for fingerprint in fingerprints:
        path = next((fingerprint[k] for k in keys if isinstance(fingerprint.get(k), str) and fingerprint[k]), None) or path
    return path


def load_tokenizer(journal: Journal, run: str, given: Optional[str]) -> Any:
    """The tokenizer `--tokenizer` names, else the one the run's fingerprint names (`tokenizer_keys`), from local
    files: a ``tokenizer`` any session names, else verl's keys."""
    path = given
    if not path:
        fingerprints = [opened.fingerprint for _, opened in journal.sessions(run=run)]  # the log read once
        path = _named(fingerprints, (TOKENIZER_KEY,))
        if not path:
            keys = tokenizer_keys()
            path = _named(fingerprints, keys)
            if not path:
                raise Failure(f"run {clean(run)!r} recorded no tokenizer (its fingerprint has none of "
                              f"{', '.join(keys)}): pass --tokenizer PATH, a folder its tokenizer was saved to "
                              "(save_pretrained)")
    if (os.path.isabs(path) or path.startswith(("./", "../"))) and not os.path.exists(path):
        # A path (not a hub name, which the local cache may hold) that is not there: said before transformers loads.
        raise Failure(f"cannot load the tokenizer {clean(path)!r} from local files (no such file or folder); pass "
                      "--tokenizer PATH, a folder its tokenizer was saved to")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a journal is read offline: never fetch a tokenizer
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise Failure("show --text decodes with transformers: pip install transformers") from None
    try:
        # A tokenizer folder is the journal's word: code it names (auto_map) never runs, and nothing asks
        # whether it may (transformers prompts on stdin when trust_remote_code is left unset).
        return AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise Failure(f"cannot load the tokenizer {clean(path)!r} from local files ({clean(first)}); pass --tokenizer "
                      "PATH, a folder its tokenizer was saved to") from None


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    with Journal(args.journal, readonly=True) as journal:
        run_key = choose_run(journal, args.run)
        tokenizer = load_tokenizer(journal, run_key, args.tokenizer)
        found = journal.samples(args.step, run=run_key, mode=args.mode, gen_index=args.index, tokenizer=tokenizer)
    if args.json:
        print_json({"schema_version": AUDIT_SCHEMA_VERSION, "run": run_key, "step": args.step,
                    "samples": [s.to_json() for s in found]})
        return 0
    first = found[0] if found else None
    served = "generated"
    if first is not None and first.action == "replayed":
        served = f"replayed from step {first.source_step} call #{first.source_gen_index} of run {cell(first.source_run)}"
    out.print(f"[bold]run {cell(run_key)} · {cell(args.mode)} · step {args.step} · call #{args.index}[/] · "
              f"{served} · {len(found)} samples")
    for s in found:
        facts = [f"{s.response_length} tokens" + (" (truncated)" if s.truncated else "")]
        facts += [f"{cell(stage)} {value:g}" for stage, value in s.rewards.items()]
        if s.logprob_mean is not None:
            facts.append(f"log-prob mean {s.logprob_mean:.4f}")
        out.print(f"[bold]sample {s.index}[/] · {' · '.join(facts)}")
        out.print(f"  [dim]prompt:[/]   {cell(s.prompt)}")
        out.print(f"  [dim]response:[/] {cell(s.response)}")
    return 0
