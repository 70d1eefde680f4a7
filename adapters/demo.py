"""`make demo`: a training-shaped loop that records rollouts once, then replays them.

Run 1 generates steps 1-6 with the `cache` policy (step 4 makes two generate calls, as DAPO does).
Run 2 replays steps 1-6 and serves steps 7-8 with `repeat`, from a generator that raises if called.
Then a table shows every call: step, generated or replayed, and from which recorded step.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import sys
from typing import List, Optional

import torch
from rich.console import Console
from rich.table import Table

from stepjournal import Journal, journaled
from stepjournal.index import session_names
from stepjournal.log import console_logging
from stepjournal.vocabulary import ACTION_COLOURS, Action

DEFAULT_PATH = "./.stepjournal-demo"
BATCH, PROMPT_LEN, RESPONSE_LEN, VOCAB = 8, 16, 32, 5000


def fake_generate(prompts: torch.Tensor, step: int) -> dict:
    """A stand-in for an inference engine: a seeded rollout batch shaped like verl's."""
    g = torch.Generator().manual_seed(1000 + step * 10 + int(prompts.sum()) % 10)
    responses = torch.randint(0, VOCAB, (prompts.shape[0], RESPONSE_LEN), generator=g)
    return {
        "prompts": prompts,
        "responses": responses,
        "attention_mask": torch.ones(prompts.shape[0], PROMPT_LEN + RESPONSE_LEN, dtype=torch.int64),
        "old_log_probs": -torch.rand(prompts.shape[0], RESPONSE_LEN, generator=g, dtype=torch.float32),
        "uid": [f"step{step}-sample{i}" for i in range(prompts.shape[0])],
        "reward_model": [{"style": "rule", "ground_truth": str(i * step)} for i in range(prompts.shape[0])],
        "meta_info": {"temperature": 1.0, "step": step},
    }


def refuse_to_generate(prompts: torch.Tensor, step: int) -> dict:
    raise RuntimeError("run 2 must not generate: every call should be replayed")


def prompts_for(step: int, call: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, PROMPT_LEN), generator=torch.Generator().manual_seed(step * 7 + call))


def train(journal: Journal, generate, policy: str, steps: range) -> None:
    rollout = journaled(generate, journal, policy)
    for step in steps:
        calls = 2 if step == 4 else 1  # step 4 filters too many samples and asks again, as DAPO does
        for call in range(calls):
            batch = rollout(prompts_for(step, call), step=step)
            # The rest of the pipeline (rewards, advantages, loss) would consume `batch` here.
            assert batch["responses"].shape == (BATCH, RESPONSE_LEN)


def call_table(journal: Journal) -> Table:
    table = Table(title=f"every generate call in {journal.path}")
    for column in ("session", "step", "call", "action", "served from", "policy"):
        table.add_column(column)
    names = session_names(event.session for _, event in journal.sessions())  # s1, s2 ..., as every verb shows
    for record in journal.audit():
        source = "-" if record.source_step is None else f"step {record.source_step} call {record.source_gen_index}"
        action = f"[{ACTION_COLOURS[Action(record.action)]}]{record.action}[/]"
        table.add_row(names[record.session], str(record.step), str(record.gen_index), action, source, record.policy)
    return table


def audit_command(path: str) -> str:
    """The audit command line for `path` as a user can type it here: the venv's script when not on PATH."""
    script = os.path.join(os.path.dirname(sys.executable), "stepjournal")
    if not os.path.exists(script):
        return f"{shlex.quote(sys.executable)} -m stepjournal audit {shlex.quote(path)}"
    if shutil.which("stepjournal") != script:
        rel = os.path.relpath(script)
        script = rel if not rel.startswith("..") else script
        if os.sep not in script:
            script = os.path.join(".", script)
    else:
        script = "stepjournal"
    return f"{shlex.quote(script)} audit {shlex.quote(path)}"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stepjournal.adapters.demo", description=__doc__)
    parser.add_argument("--path", default=DEFAULT_PATH, help="journal folder (recreated)")
    args = parser.parse_args(argv)
    # The library never configures logging; the demo shows warnings on stderr and keeps stdout to the table.
    with console_logging(logging.WARNING):
        return _run(args.path)


def _run(path: str) -> int:
    shutil.rmtree(path, ignore_errors=True)
    console = Console()
    with Journal(path, run="demo", fingerprint={"model": "fake", "batch": BATCH}) as journal:
        train(journal, fake_generate, "cache", range(1, 7))
    with Journal(path, run="demo", fingerprint={"model": "fake", "batch": BATCH}) as journal:
        train(journal, refuse_to_generate, "replay@1-6;repeat", range(1, 9))
    with Journal(path, readonly=True) as journal:
        console.print(call_table(journal))
    # One line, never wrapped: it is a command to copy, and it must run as printed from this folder.
    console.print(f"run 2 generated nothing; inspect the journal with: {audit_command(path)}", soft_wrap=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
