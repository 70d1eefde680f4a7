"""`stepjournal diff` on two real TRL GRPO runs that replay the same generations with different rewards (issue 16).

Both runs start from one recorded journal (test_trl_stages.py's recording, beta 0.04) and replay its
generations; run B's reward function, under the same name, is run A's negated. The CLI is run in a
subprocess; docs/diff.md's ``stepjournal diff run-a run-b`` through a shell, as typed.
"""

from __future__ import annotations

import json
import re
import subprocess

from stepjournal import Journal
from stepjournal.adapters.trl import attach

from test_trl_adapter import GENERATION_STEPS, STEPS, forbid_generation
from test_trl_adapter import tokenizer  # noqa: F401  (the fixtures this module uses)
from test_trl_stages import copy_journal, grpo_beta, make_reward, model_dir, recorded  # noqa: F401
from cli_support import run_cli
from doc_lines import command_lines, run_line

DOC_LINES = [line for line in command_lines("docs/diff.md") if line.text == "stepjournal diff run-a run-b"]


# -- issue 16: two runs on the same generations, with different rewards -----------------------------------------
def test_diff_of_two_runs_replaying_the_same_generations_with_other_rewards_finds_the_reward(
    tokenizer, model_dir, recorded, tmp_path, monkeypatch  # noqa: F811
):
    source, _, _, _, _ = recorded
    # Both runs replay the recorded generations; run B's reward function (same name, new version) is negated.
    for name, scale in (("run-a", 1.0), ("run-b", -1.0)):
        trainer = grpo_beta(tokenizer, model_dir, tmp_path / f"out-{name}", make_reward("length", scale))
        forbid_generation(trainer, monkeypatch)
        with Journal(copy_journal(source, tmp_path / name)) as journal:
            attach(trainer, journal, "generate:replay/reward:dump/old_log_prob:dump/ref_log_prob:dump")
            trainer.train()

    def cli(*args: str) -> subprocess.CompletedProcess:
        return run_cli("diff", *args, cwd=tmp_path)

    (line,) = DOC_LINES
    shown = run_line(line.text, tmp_path)
    assert shown.returncode == 1, shown.stderr
    summary = " ".join(shown.stdout.split("\nA: ")[0].split())
    assert "at step 0 the first differing stage is reward.length" in summary, shown.stdout
    # The stages in the order TRL ran them in a step (the journal names none of them): generate first.
    assert re.search(r"; generate(, [\w.]+)* (is|are) equal", summary), summary

    as_json = cli("run-a", "run-b", "--json")
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    first = report["first_divergence"]
    order = report["stage_order"]
    assert order[0] == "generate" and {"reward.length", "old_log_prob", "ref_log_prob", "metrics"} <= set(order)
    assert (first["step"], first["stage"], first["state"]) == (0, "reward.length", "differing")
    states = {(p["stage"], p["step"]): p["state"] for p in report["pairs"]}
    assert {states[("generate", s)] for s in GENERATION_STEPS} == {"equal"}
    assert {states[("reward.length", s)] for s in GENERATION_STEPS} == {"differing"}
    # The reference model never trains; the policy's log-probs part once its weights have: at step 2.
    assert [states[("ref_log_prob", s)] for s in GENERATION_STEPS] == ["equal", "equal"]
    assert [states[("old_log_prob", s)] for s in GENERATION_STEPS] == ["equal", "differing"]
    # The training parts from its first logged step on: every step's logged metrics differ.
    assert [states[("metrics", s)] for s in range(1, STEPS + 1)] == ["differing"] * STEPS

    # --text: the first sample whose reward differs, the same completion on both sides.
    folder = tmp_path / "tokenizer"
    tokenizer.save_pretrained(folder)
    as_text = cli("run-a", "run-b", "--text", "--tokenizer", str(folder), "--json")
    assert as_text.returncode == 1, as_text.stderr
    text = json.loads(as_text.stdout)["text"]
    a, b = text["a"], text["b"]
    with Journal(str(tmp_path / "run-a"), readonly=True) as journal:
        rewards = journal.load_output(journal.lookup(0, stage="reward.length"))["rewards"]
    first = next(i for i, r in enumerate(rewards) if r != 0.0)  # a reward of 0 is its own negation
    assert (text["step"], text["sample"], text["token_offset"]) == (0, first, None)
    assert a["response"] == b["response"] and a["response_ids"] == b["response_ids"]
    assert a["rewards"]["reward.length"] == -b["rewards"]["reward.length"] == float(len(a["response"]) % 5) != 0
    shown = cli("run-a", "run-b", "--text", "--tokenizer", str(folder))
    assert f"first differing sample: step 0 · sample {first}" in shown.stdout
