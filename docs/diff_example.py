"""Make the example of docs/diff.md: a recorded run, a replay that changes a few steps, and their diff.

    .venv/bin/python docs/diff_example.py            # prints the table, rewrites docs/diff-example.png

The journal is written to a temporary folder and removed afterwards.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import torch
from stepjournal import Journal, journaled
from stepjournal.adapters.cli import main as stepjournal

HERE = os.path.dirname(os.path.abspath(__file__))


def rollout_output(step: int, call: int, *, changed: bool) -> dict:
    g = torch.Generator().manual_seed(step * 10 + call)
    out = {
        "responses": torch.randint(3, 32_000, (16, 48), generator=g),
        "old_log_probs": -torch.rand(16, 48, generator=g),
        "reward": (torch.rand(16, generator=g) > 0.5).to(torch.float32),
        "meta_info": {"temperature": 1.0},
    }
    if changed and step == 5:
        out["old_log_probs"][2, 7] += 2e-6  # another kernel's rounding: within the float32 tolerance
    if changed and step >= 7 and call == 0:
        out["reward"][12] = 1.0 - out["reward"][12]  # a changed reward function
    if changed and step == 8 and call == 1:
        out["old_log_probs"][3, 17] += 0.05
    return out


def build(path: str) -> tuple:
    with Journal(path, run="exp") as journal:
        for step in range(1, 11):
            for call in (0, 1):
                journal.record(step, rollout_output(step, call, changed=False), gen_index=call)
        recorded = journal.session

    def rollout(prompts, *, step, call):
        return rollout_output(step, call, changed=True)

    with Journal(path, run="exp") as journal:
        fn = journaled(rollout, journal, "replay@1-4;dump", input_of=None)
        for step in range(1, 10):  # the replay stopped one step early
            for call in (0, 1):
                fn("prompts", step=step, call=call)
        replayed = journal.session
    return recorded, replayed


def main() -> int:
    folder = tempfile.mkdtemp(prefix="diff-example-")
    try:
        path = os.path.join(folder, "journal")
        recorded, replayed = build(path)
        out = os.path.join(HERE, "diff-example.png")
        os.environ.setdefault("COLUMNS", "100")
        code = stepjournal(["diff", path, path, "--session-a", "s1", "--session-b", "s2", "--plot", out])
        print(f"exit status {code}", file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
