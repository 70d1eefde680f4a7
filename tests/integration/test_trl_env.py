"""A TRL script nobody edits is journaled through the environment: ``STEPJOURNAL=PATH[:POLICY] python -m
stepjournal.adapters.trl SCRIPT``, with TRL's real `GRPOTrainer` on the tiny offline model (tests/trl_tiny.py),
run through bash; and TRL's own ``trl.scripts.grpo`` with a ``--config`` whose ``env:`` section names the journal.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from doc_lines import command_lines, run_line

from stepjournal import Journal

TESTS = Path(__file__).resolve().parents[1]
DOC_LINES = [line for line in command_lines("docs/trl.md", section="No edit: the environment")]

# A plain TRL script: it imports nothing of stepjournal.
SCRIPT = """\
import json
import sys
from pathlib import Path

from trl import GRPOConfig, GRPOTrainer
from trl_tiny import grpo_args, length_reward, logged, prompts_dataset, tiny_model, tiny_tokenizer

out = Path(sys.argv[1])
tokenizer = tiny_tokenizer()
trainer = GRPOTrainer(model=tiny_model(tokenizer), args=GRPOConfig(**grpo_args(out, max_steps=4)),
                      processing_class=tokenizer, reward_funcs=length_reward, train_dataset=prompts_dataset())
trainer.train()
(out / "logged.json").write_text(json.dumps(logged(trainer)))
"""

# What TRL's own grpo script reads (docs/trl.md shows the same file).
CONFIG = """\
env:
  STEPJOURNAL: runs/grpo:cache
model_name_or_path: tiny-model
dataset_name: prompts
reward_funcs: [trl_tiny.length_reward]
output_dir: out
per_device_train_batch_size: 4
num_generations: 4
steps_per_generation: 2
max_completion_length: 8
max_steps: 4
logging_steps: 1
beta: 0.0
seed: 7
bf16: false
use_cpu: true
report_to: []
save_strategy: "no"
disable_tqdm: true
"""

OFFLINE = {"PYTHONPATH": str(TESTS), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "STEPJOURNAL": None,
           "STEPJOURNAL_RUN": None}


def generate_actions(path: Path, session: str) -> list:
    with Journal(str(path), readonly=True) as journal:
        return [(r.step, r.action) for r in journal.audit() if r.session == session and r.stage == "generate"]


def test_the_docs_show_the_lines_this_module_runs():
    texts = [line.text for line in DOC_LINES]
    assert "STEPJOURNAL=runs/grpo:cache python -m stepjournal.adapters.trl train.py out-record" in texts
    assert "STEPJOURNAL=runs/grpo:replay python -m stepjournal.adapters.trl train.py out-replay" in texts
    assert "python -m stepjournal.adapters.trl -m trl.scripts.grpo --config grpo.yaml" in texts


def test_an_unedited_script_records_through_the_environment_and_replays_bit_for_bit(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    record, replay = (line.text for line in DOC_LINES[:2])
    for line in (record, replay):
        done = run_line(line, tmp_path, env=OFFLINE)
        assert done.returncode == 0, done.stderr[-3000:]
    journal = tmp_path / "runs" / "grpo"
    with Journal(str(journal), readonly=True) as opened:
        first, second = [event.session for _, event in opened.sessions()][:2]
    # TRL generates at optimizer steps 0 and 2 (steps_per_generation=2): recorded, then served.
    assert generate_actions(journal, first) == [(0, "generated"), (2, "generated")]
    assert generate_actions(journal, second) == [(0, "replayed"), (2, "replayed")]
    recorded = json.loads((tmp_path / "out-record" / "logged.json").read_text())
    replayed = json.loads((tmp_path / "out-replay" / "logged.json").read_text())
    assert replayed == recorded  # losses, rewards, grad norms: bit for bit


def test_trls_own_grpo_script_is_journaled_by_its_config_env_section(tmp_path):
    import sys

    from trl_tiny import prompts_dataset, tiny_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    tiny_model(tokenizer).save_pretrained(tmp_path / "tiny-model")
    tokenizer.save_pretrained(tmp_path / "tiny-model")
    prompts_dataset().to_json(str(tmp_path / "prompts" / "train.jsonl"))
    (tmp_path / "grpo.yaml").write_text(CONFIG)
    (line,) = [line.text for line in DOC_LINES if "--config" in line.text]
    done = run_line(line, tmp_path, env=OFFLINE)
    assert done.returncode == 0, done.stderr[-3000:]
    with Journal(str(tmp_path / "runs" / "grpo"), readonly=True) as journal:
        (session,) = [event.session for _, event in journal.sessions()]
    assert generate_actions(tmp_path / "runs" / "grpo", session) == [(0, "generated"), (2, "generated")]
    assert sys.executable  # the line ran this interpreter's python (run_line puts its bin first)


def test_without_the_variable_training_stops_before_it_starts_saying_what_to_set(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    done = run_line("python -m stepjournal.adapters.trl train.py out", tmp_path, env=OFFLINE)
    assert done.returncode == 1
    assert "STEPJOURNAL='' names no journal: set STEPJOURNAL=PATH[:POLICY]" in done.stderr
    assert not (tmp_path / "out" / "logged.json").exists()


@pytest.mark.parametrize("value,path,policy", [
    ("runs/grpo", "runs/grpo", "cache"),
    ("runs/grpo:replay", "runs/grpo", "replay"),
    ("/data/j:dump@0-10;repeat", "/data/j", "dump@0-10;repeat"),
    ("j:generate:replay/reward:cache", "j", "generate:replay/reward:cache"),  # a per-stage spec keeps its colons
])
def test_the_variable_is_a_path_then_a_policy(value, path, policy):
    from stepjournal.adapters.trl import EnvJournal, journal_from_env

    assert journal_from_env({"STEPJOURNAL": value, "STEPJOURNAL_RUN": "exp1"}) == EnvJournal(path, policy, "exp1")


@pytest.mark.parametrize("value,says", [
    ("runs/grpo:cahce", "unknown policy 'cahce' (did you mean 'cache'?)"),
    ("runs/grpo:cache; rm", "unknown policy 'rm'"),
    ("runs/my:journal", "the path 'runs/my' ends at the first ':'"),  # a path with a colon: the rest is the policy
    ("", "names no journal"),
])
def test_a_bad_value_set_at_launch_stops_before_the_script_runs_in_one_line(value, says, tmp_path):
    """Before the model loads, and no journal folder is made for a typo."""
    (tmp_path / "train.py").write_text(SCRIPT)
    done = run_line("python -m stepjournal.adapters.trl train.py out", tmp_path, env={**OFFLINE, "STEPJOURNAL": value})
    assert done.returncode == 2
    assert done.stderr.startswith(f"stepjournal: error: STEPJOURNAL={value!r}") or "names no journal" in done.stderr
    assert says in done.stderr and len(done.stderr.splitlines()) == 1
    assert not (tmp_path / "runs").exists() and not (tmp_path / "out").exists()


def test_a_stage_the_trainer_lacks_is_refused_before_the_journal_opens(tmp_path):
    """Set after launch (as a TRL config's env: section does), the spec is checked against the trainer's stages."""
    (tmp_path / "train.py").write_text('import os\nos.environ["STEPJOURNAL"] = "runs/grpo:generate:cache/rewrd:replay"\n'
                                       + SCRIPT)
    done = run_line("python -m stepjournal.adapters.trl train.py out", tmp_path, env=OFFLINE)
    assert done.returncode == 1
    assert "TrlAdapterError: STEPJOURNAL='runs/grpo:generate:cache/rewrd:replay'" in done.stderr
    assert "'rewrd'" in done.stderr and "did you mean 'reward'" in done.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("args,status,says", [
    ("missing.py", 2, "can't open file"),
    ("-m no_such_module_here", 1, "No module named no_such_module_here"),
])
def test_a_missing_script_or_module_says_so_in_one_line_as_python_does(args, status, says, tmp_path):
    done = run_line(f"python -m stepjournal.adapters.trl {args}", tmp_path, env={**OFFLINE, "STEPJOURNAL": "j"})
    assert done.returncode == status
    assert says in done.stderr and len(done.stderr.splitlines()) == 1
