"""Make the timeline pictures of docs/audit.md: journals of 8, 300 and 30 000 steps, drawn by the CLI.

    .venv/bin/python docs/timeline_examples.py                  # rewrites docs/timeline-300.png, -30000.png
    .venv/bin/python docs/timeline_examples.py --steps 8 --out /tmp   # one journal, picture in /tmp

Each journal is built through the public API as a training loop would build it: a first session
under ``dump@1-5;repeat`` with a validation call every few steps (bypassed), a resumed session that
replays steps 1-5 exactly (``replay``), and a third under ``cache`` for the second third of the steps.
The journals are written to a temporary folder and removed afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

import torch

from stepjournal import Journal, journaled
from stepjournal.adapters.cli import main as cli

HERE = os.path.dirname(os.path.abspath(__file__))


def rollout(prompts: torch.Tensor, step: int) -> dict:
    return {"ids": prompts + step}


def build(path: str, steps: int) -> None:
    """Three sessions of run ``exp`` over `steps` steps (see the module docstring)."""
    every = 4 if steps < 50 else max(10, steps // 30)  # a validation call this often
    prompts = torch.arange(4)
    with Journal(path, run="exp", sync=False) as journal:
        train = journaled(rollout, journal, "dump@1-5;repeat")
        validate = journaled(rollout, journal, "dump@1-5;repeat", mode_of=lambda *a, **k: "validate")
        for step in range(1, steps + 1):
            train(prompts, step=step)
            if step % every == 0:
                validate(prompts, step=step)
    third = max(2, steps // 3)
    with Journal(path, run="exp", sync=False) as journal:
        resumed = journaled(rollout, journal, "replay")
        for step in range(1, min(5, third) + 1):
            resumed(prompts, step=step)
    with Journal(path, run="exp", sync=False) as journal:
        cached = journaled(rollout, journal, "cache")
        for step in range(third + 1, min(steps, 2 * third) + 1):
            cached(prompts, step=step)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[300, 30_000])
    parser.add_argument("--out", default=HERE, help="the folder for timeline-N.png (default docs/)")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="stepjournal-timeline-")
    try:
        for steps in args.steps:
            path = os.path.join(work, f"journal-{steps}")
            build(path, steps)
            status = cli(["timeline", path, "--out", os.path.join(args.out, f"timeline-{steps}.png")])
            if status:
                return status
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
