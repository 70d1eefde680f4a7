"""The report at scale: what ``stepjournal report`` costs, and the file it writes, for a long run with many samples.

``python -m benchmarks._bench_report [--steps N] [--samples N] [--workdir DIR] [--keep] [--journal PATH
--tokenizer PATH]`` prints a JSON report (default: 10 000 steps of 500 samples). The journal is grown
as a trainer grows it, through the public API: per step, one generate call recorded with its input
(a plain dict: ``prompt_ids`` and ``response_ids``, int32, right-padded with the tokenizer's pad id,
32 and 64 tokens at most) and a ``reward`` stage (``rewards``, one float per sample), with
``sync=False`` (the build is setup, not a figure). The tokenizer is a real word-level one, saved with
``transformers``' ``save_pretrained`` and loaded back by the command offline.

Reported, in a fresh process as a user meets it: ``report`` (``stepjournal report J -o run.html``): its
wall and CPU time, its peak memory (``benchmarks._measure.cli_command``: the resident high-water mark,
which counts the journal's mapped pages too, and the process's own memory) and the file's size in bytes.
Goals: the file at most 50 MB (a browser opens it), and the command's own memory at most 2 GB whatever
the journal's length (one step's samples in memory at a time). The resident figure is not held to it:
a read of every payload brings the whole journal's file pages in, clean pages the kernel drops under
pressure, so it grows with the journal whatever the command keeps.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from ._measure import cli_command, disk_bytes, machine_facts, stamped
from ._scale import add_place_arguments, scale_workdir

__all__ = ["build_journal", "build_tokenizer", "bench_report", "main"]

FILE_GOAL_BYTES = 50 * 1000 * 1000
MEMORY_GOAL_BYTES = 2 * 1000 * 1000 * 1000
PROMPT_TOKENS, RESPONSE_TOKENS = 32, 64
_WORDS = [f"w{i}" for i in range(2000)]


def build_tokenizer(folder: Path) -> str:
    """A word-level tokenizer over `_WORDS`, saved with ``save_pretrained``: ``<pad>`` is 0, ``<eos>`` 1."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, **{w: i + 2 for i, w in enumerate(_WORDS)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
    fast.save_pretrained(str(folder))
    return str(folder)


def build_journal(path: Path, steps: int, samples: int, progress: Any) -> None:
    """`steps` steps of `samples` samples each, grown step by step through `Journal.record`."""
    import torch

    from stepjournal import Journal

    generator = torch.Generator().manual_seed(0)
    with Journal(str(path), run="bench", sync=False) as journal:
        for step in range(1, steps + 1):
            prompts = torch.randint(2, len(_WORDS) + 2, (samples, PROMPT_TOKENS), generator=generator, dtype=torch.int32)
            responses = torch.randint(2, len(_WORDS) + 2, (samples, RESPONSE_TOKENS), generator=generator,
                                      dtype=torch.int32)
            lengths = torch.randint(8, RESPONSE_TOKENS, (samples,), generator=generator)
            for row, n in enumerate(lengths.tolist()):  # each response ends with <eos>, then padding
                responses[row, n] = 1
                responses[row, n + 1:] = 0
            journal.record(step, {"prompt_ids": prompts, "response_ids": responses},
                           input={"prompt_ids": prompts})
            journal.record(step, {"rewards": torch.rand(samples, generator=generator)}, stage="reward")
            if step % 1000 == 0:
                progress(f"recorded {step}/{steps} steps")


def bench_report(workdir: Path, steps: int, samples: int, progress: Any, journal: Optional[Path] = None,
                 tokenizer: Optional[str] = None) -> Dict[str, Any]:
    figures: Dict[str, Any] = {"steps": steps, "samples_per_step": samples}
    if journal is None:
        tokenizer = build_tokenizer(workdir / "tokenizer")
        journal = workdir / "journal"
        started = time.perf_counter()
        build_journal(journal, steps, samples, progress)
        figures["build_s"] = time.perf_counter() - started
    figures["journal_bytes"] = disk_bytes(journal)
    progress("stepjournal report")
    out = workdir / "run.html"
    done = cli_command(["report", str(journal), "-o", str(out), "--tokenizer", str(tokenizer)])
    figures["report"] = {**done, "file_bytes": out.stat().st_size if out.exists() else None}
    return figures


def report_goals(figures: Dict[str, Any]) -> Dict[str, Any]:
    done = figures["report"]
    return {
        "report_file_bytes": {"goal": FILE_GOAL_BYTES, "measured": done["file_bytes"],
                              "met": done["rc"] == 0 and done["file_bytes"] <= FILE_GOAL_BYTES},
        "report_peak_anon_bytes": {"goal": MEMORY_GOAL_BYTES, "measured": done.get("peak_anon_bytes"),
                                   "met": done["rc"] == 0 and (done.get("peak_anon_bytes") or 0) <= MEMORY_GOAL_BYTES},
    }


def main(argv: Optional[List[str]] = None) -> int:
    """Entry point: the report on stdout, progress on stderr; exits 0 whatever the goals say."""
    p = argparse.ArgumentParser(prog="python -m benchmarks._bench_report", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10_000, help="steps to build (default 10 000)")
    p.add_argument("--samples", type=int, default=500, help="samples per step (default 500)")
    p.add_argument("--tokenizer", help="with --journal: the tokenizer folder to decode with")
    add_place_arguments(p)
    args = p.parse_args(argv)
    if (args.journal is None) != (args.tokenizer is None):
        p.error("--journal and --tokenizer go together")
    with scale_workdir("stepjournal-report-", args) as workdir:
        figures = bench_report(workdir, args.steps, args.samples, stamped, args.journal, args.tokenizer)
    report = {"machine": machine_facts(), "figures": figures, "goals": report_goals(figures)}
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
