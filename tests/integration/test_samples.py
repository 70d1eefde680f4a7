"""`Journal.samples` and `stepjournal show J STEP --text`: each sample decoded with the run's own tokenizer,
beside its reward and log-prob, replay-aware.

The tokenizer is real: a word-level `tokenizers` model saved with transformers' `save_pretrained` into a
folder, loaded back offline by the command line from the path the run's fingerprint names.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stepjournal import Journal, Sample
from stepjournal.errors import JournalError
from stepjournal.tools import samples_of_steps
from cli_support import run_cli
from doc_lines import command_lines, run_line

# docs/reading.md's lines on its journals `j`, `a` and `b`, run through a shell as typed (those of "Which viewer,
# when" run in test_export_tensorboard.py).
DOC_LINES = [line for line in command_lines("docs/reading.md") if " JOURNAL " not in line.text
             and line not in command_lines("docs/reading.md", section="Which viewer, when")]
SHOW_1, SHOW_2, DIFF = (line.text for line in DOC_LINES)

PAD, EOS = 0, 1
VOCAB = ["<pad>", "</s>", "the", "cat", "sat", "on", "a", "mat", "dog", "ran", "what", "is", "two", "plus", "four"]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<pad>"))
    model.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=model, pad_token="<pad>", eos_token="</s>")
    folder = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(folder)
    return str(folder)


def ids(text: str) -> list[int]:
    return [VOCAB.index(w) for w in text.split()]


def verl_batch() -> dict:
    """Two samples in verl's padded form: prompts left-padded, responses right-padded, one attention mask."""
    prompts = torch.tensor([[PAD, *ids("what is two")], ids("the cat sat on")])
    # The second response fills its length without the end-of-sequence token: truncated.
    responses = torch.tensor([[*ids("four"), EOS, PAD, PAD, PAD], ids("a mat the dog ran")])
    mask = torch.cat([(prompts != PAD), (responses != PAD)], dim=1).long()
    return {"prompts": prompts, "responses": responses, "attention_mask": mask}


@pytest.fixture
def journal_path(tmp_path, tokenizer_dir):
    path = str(tmp_path / "j")
    with Journal(path, run="exp", fingerprint={"tokenizer": tokenizer_dir}) as journal:
        recorded = journal.record(1, verl_batch())
        journal.record(1, {"rewards": torch.tensor([1.0, 0.0])}, stage="reward")
        logps = torch.full((2, 5), -9.0)
        logps[0, :2], logps[1, :] = torch.tensor([-1.0, -3.0]), -0.5
        journal.record(1, {"old_log_probs": logps}, stage="old_log_prob")
        journal.record_replay(2, recorded, policy="repeat", reason="repeat: step 2 -> recorded step 1")
    return path


def test_samples_decode_each_sample_with_its_reward_and_log_prob(journal_path, tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    with Journal(journal_path, readonly=True) as journal:
        first, second = journal.samples(1, tokenizer=tokenizer)
        replayed = journal.samples(2, tokenizer=tokenizer)
        bare = journal.samples(1)
    assert isinstance(first, Sample)
    assert (first.prompt, first.response) == ("what is two", "four")
    assert (second.prompt, second.response) == ("the cat sat on", "a mat the dog ran")
    assert first.response_ids == (*ids("four"), EOS) and first.prompt_ids == tuple(ids("what is two"))
    assert (first.truncated, second.truncated) == (False, True)
    assert (first.rewards, second.rewards) == ({"reward": 1.0}, {"reward": 0.0})
    assert (first.logprob_mean, second.logprob_mean) == (-2.0, -0.5)  # over the response's own tokens
    # Step 2 served step 1's answers: they say so, and are never shown as step 2's own.
    assert [(s.action, s.source_step, s.response) for s in replayed] == [("replayed", 1, "four"),
                                                                        ("replayed", 1, "a mat the dog ran")]
    assert bare[0].response is None and bare[0].response_ids == first.response_ids


def test_show_text_prints_prompt_response_and_reward_with_the_runs_own_tokenizer(journal_path):
    assert (SHOW_1, SHOW_2) == ("stepjournal show j 1 --text", "stepjournal show j 2 --text")
    folder = Path(journal_path).parent
    shown = run_line(SHOW_1, folder, env={"COLUMNS": "100"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == "run exp · train · step 1 · call #0 · generated · 2 samples"
    assert lines[1:4] == ["sample 0 · 2 tokens · reward 1 · log-prob mean -2.0000",
                          "  prompt:   what is two", "  response: four"]
    assert lines[4] == "sample 1 · 5 tokens (truncated) · reward 0 · log-prob mean -0.5000"
    replayed = run_cli("show", journal_path, "2", "--text", "--json")
    assert replayed.returncode == 0, replayed.stderr
    data = json.loads(replayed.stdout)
    assert [(s["action"], s["source_step"], s["response"]) for s in data["samples"]] == [
        ("replayed", 1, "four"), ("replayed", 1, "a mat the dog ran")]
    header = run_line(SHOW_2, folder).stdout.splitlines()[0]
    assert header == "run exp · train · step 2 · call #0 · replayed from step 1 call #0 of run exp · 2 samples"
    # docs/reading.md shows these two outputs as they are printed here.
    page = (Path(__file__).resolve().parents[2] / "docs" / "reading.md").read_text(encoding="utf-8")
    block = page.split("$ stepjournal show j 1 --text\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[:len(lines)] == lines and block[len(lines):] == ["$ stepjournal show j 2 --text", header, "..."]


def test_the_tokenizer_keys_are_read_without_importing_a_framework_and_are_the_ones_the_adapters_write(tmp_path):
    from stepjournal.adapters._tokenizer_keys import (  # private: the adapters' shared helper under test
        TOKENIZER_KEY, VERL_TOKENIZER_KEYS,
    )
    from stepjournal.adapters.verl import TOKENIZER_KEYS
    from stepjournal.adapters.verl._fingerprint import GENERATION_KEYS  # private: a verl adapter internal under test

    assert TOKENIZER_KEYS == VERL_TOKENIZER_KEYS and set(VERL_TOKENIZER_KEYS) <= set(GENERATION_KEYS)
    assert GENERATION_KEYS[VERL_TOKENIZER_KEYS[0]] == "actor_rollout_ref.model.tokenizer_path"  # verl's first choice
    assert TOKENIZER_KEY == "tokenizer"  # TRL's (`trainer_fingerprint`), as recorded journals hold it
    # The command line's read of them, and its line when no session names one, import neither verl nor
    # transformers (seconds each): the user is told what to pass at once.
    path = str(tmp_path / "j")
    with Journal(path, run="exp") as journal:
        journal.record(1, b"no tokens")
    code = ("import sys; from stepjournal.adapters.cli import main; status = main(['show', sys.argv[1], '1', '--text', "
            "*sys.argv[2:]]); print(status, sorted({'verl', 'transformers'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "1 []", done.stdout + done.stderr  # 1: b"no tokens" holds no samples
    assert done.stderr.splitlines() == ["stepjournal: error: the generate output at step 1 (event #2) holds none of "
                                        "completion_ids, response_ids, responses: no samples to read (docs/reading.md "
                                        "lists the forms read)"]  # one line: the hint waits for samples to show
    # So does a --tokenizer path that is not there (a hub name is looked up in the local cache by transformers).
    nowhere = str(tmp_path / "nowhere")
    done = subprocess.run([sys.executable, "-c", code, path, "--tokenizer", nowhere], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip() == "1 []", done.stdout + done.stderr
    assert f"cannot load the tokenizer {nowhere!r} from local files (no such file or folder)" in done.stderr


def test_a_missing_tokenizer_shows_ids_and_one_line_saying_where_to_read_how_to_get_text(tmp_path, tokenizer_dir):
    path = str(tmp_path / "no-tokenizer")
    with Journal(path, run="exp") as journal:
        journal.record(1, verl_batch())
    done = run_cli("show", path, "1", "--text")
    assert done.returncode == 0 and done.stderr.splitlines() == [
        "run 'exp' kept no tokenizer, so ids are shown; for text see docs/reading.md"]
    assert "  response: ids [" in done.stdout
    gone = run_cli("show", path, "1", "--text", "--tokenizer", str(tmp_path / "nowhere"))
    assert gone.returncode == 1 and "cannot load the tokenizer" in gone.stderr and "Traceback" not in gone.stderr
    given = run_cli("show", path, "1", "--text", "--tokenizer", tokenizer_dir, "--json")
    assert given.returncode == 0 and json.loads(given.stdout)["samples"][0]["response"] == "four"


def test_a_payload_without_response_ids_names_the_forms_read(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path) as journal:
        journal.record(1, {"logits": torch.zeros(2, 3)})
    with Journal(path, readonly=True) as journal, pytest.raises(JournalError, match="completion_ids, response_ids"):
        journal.samples(1)


def test_diff_text_shows_the_first_differing_sample_side_by_side_with_its_first_differing_token(
        tmp_path, tokenizer_dir):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for path, answer, reward in ((a, "a mat the dog ran", 0.0), (b, "a mat the cat ran", 1.0)):
        batch = verl_batch()
        batch["responses"][1] = torch.tensor(ids(answer))
        with Journal(path, run="exp", fingerprint={"tokenizer": tokenizer_dir}) as journal:
            journal.record(1, batch)
            journal.record(1, {"rewards": torch.tensor([1.0, reward])}, stage="reward")
    assert DIFF == "stepjournal diff a b --text"
    done = run_line(DIFF, tmp_path, env={"COLUMNS": "80"})
    assert done.returncode == 1, done.stderr
    lines = done.stdout.splitlines()
    start = lines.index("first differing sample: step 1 · sample 1 · first differing token at offset 3")
    shown = [" ".join(line.split()) for line in lines[start + 1:]]
    assert shown[0] == "A B" and shown[2:] == [
        "reward 0 1", "prompt the cat sat on the cat sat on", "response a mat the dog ran a mat the cat ran"]
    as_json = json.loads(run_cli("diff", a, b, "--text", "--json").stdout)["text"]
    assert (as_json["step"], as_json["sample"], as_json["token_offset"]) == (1, 1, 3)
    assert as_json["a"]["marked"] == {"before": "a mat the", "token": " dog", "after": " ran"}
    assert as_json["b"]["marked"] == {"before": "a mat the", "token": " cat", "after": " ran"}
    # docs/reading.md shows this output as it is printed here.
    page = (Path(__file__).resolve().parents[2] / "docs" / "reading.md").read_text(encoding="utf-8")
    block = page.split("$ stepjournal diff a b --text\n", 1)[1].split("```", 1)[0].splitlines()
    assert [" ".join(line.split()) for line in block] == [" ".join(line.split()) for line in lines[:len(block)]]


def test_verl_v1_batches_jagged_rows_are_read_through_the_tq_batch_codec(tmp_path, tokenizer_dir):
    """V1's TQBatch (the real class and codec): jagged prompts and responses, no padding; the reward and log-prob
    stages as V1's stage hooks record them (``{"fields": TQBatch, "metrics": ...}``); the tokenizer found where verl
    loads it from, the model path its fingerprint names."""
    from tensordict import TensorDict
    from transformers import AutoTokenizer

    from stepjournal.adapters.verl import TOKENIZER_KEYS
    from stepjournal.adapters.verl.v1._codec import (  # private: a verl adapter internal under test
        TQBatch, register_tq_codec,
    )

    register_tq_codec()
    jagged = lambda rows: torch.nested.nested_tensor([torch.tensor(r) for r in rows], layout=torch.jagged)  # noqa: E731
    keys, tags = ("u0_0_0", "u1_0_0"), ({}, {})
    fields = TensorDict({
        "prompts": jagged([ids("what is two"), ids("the cat sat on")]),
        "responses": jagged([[*ids("four"), EOS], ids("a mat")]),
    }, batch_size=[2])
    stage = lambda name, rows: {  # noqa: E731
        "fields": TQBatch(TensorDict({name: jagged(rows)}, batch_size=[2]), keys=keys, tags=tags), "metrics": {}}
    path = str(tmp_path / "v1")
    assert TOKENIZER_KEYS == ("verl.tokenizer_path", "verl.model_path")
    with Journal(path, run="v1", fingerprint={"verl.model_path": tokenizer_dir, "verl.rollout_n": 1}) as journal:
        journal.record(1, TQBatch(fields, keys=keys, tags=tags))
        journal.record(1, stage("rm_scores", [[0.0, 1.0], [0.0, 0.0]]), stage="reward")
        journal.record(1, stage("old_log_probs", [[-1.0, -3.0], [-0.5, -0.5]]), stage="old_log_prob")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    with Journal(path, readonly=True) as journal:
        found = journal.samples(1, tokenizer=tokenizer)
    assert [(s.prompt, s.response, s.truncated) for s in found] == [("what is two", "four", False),
                                                                    ("the cat sat on", "a mat", True)]
    assert [(s.rewards, s.logprob_mean) for s in found] == [({"reward": 1.0}, -2.0), ({"reward": 0.0}, -0.5)]
    shown = run_cli("show", path, "1", "--text", "--json")  # no --tokenizer: verl.model_path names it
    assert shown.returncode == 0, shown.stderr
    assert [s["response"] for s in json.loads(shown.stdout)["samples"]] == ["four", "a mat"]


def test_decoded_limits_the_text_to_the_first_samples_and_keeps_every_samples_numbers(journal_path, tokenizer_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    with Journal(journal_path, readonly=True) as journal:
        first, second = journal.samples(1, tokenizer=tokenizer, decoded=1)
        (step, (again, _)), = list(samples_of_steps(journal, {1}, tokenizer=tokenizer, decoded=1))
    assert (first.response, second.response, second.prompt) == ("four", None, None)
    assert (second.response_length, second.rewards) == (5, {"reward": 0.0}) and again == first and step == 1


def test_token_ids_that_are_not_integers_are_an_error_that_says_so(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path, run="exp") as journal:
        journal.record(1, {"response_ids": torch.ones(2, 3)})
    with Journal(path, readonly=True) as journal, pytest.raises(JournalError, match="token ids of type float32"):
        journal.samples(1)
