"""A journal reads itself: the run's tokenizer kept in the journal (`record_tokenizer`), read back as data by
``show --text`` with no flag; a journal without one shows ids with one line saying how to get text; a hostile
tokenizer document is refused in one line, never loaded; ``show`` pages on a terminal only.

Real LMDB, a real ``tokenizers`` BPE tokenizer trained in-process, TRL's real `GRPOTrainer`, the real command
line in a subprocess (a pseudo-terminal where a TTY matters).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from stepjournal import Journal
from stepjournal.adapters import (TOKENIZER_STAGE, TokenizerDocumentError, journal_tokenizer, journaled,
                                  record_tokenizer)
from stepjournal.adapters import _tokenizer  # private: the adapters' shared helper under test
from cli_support import run_cli
from trl_tiny import PROMPTS, grpo_args, length_reward, prompts_dataset, tiny_model, tiny_tokenizer

SCRIPT = Path(sys.executable).with_name("stepjournal")


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _rollout(tokenizer, prompts):
    def generate(batch, step):
        ids = [tokenizer(p)["input_ids"] for p in batch]
        return {"prompt_ids": ids, "completion_ids": [row[::-1] + [tokenizer.eos_token_id] for row in ids]}

    return generate


def _record(path: str, tokenizer=None, steps=(1,), run: str = "exp") -> None:
    """A raw loop (`journaled`), as docs/reading.md writes it: the tokenizer recorded once after opening."""
    with Journal(path, run=run) as journal:
        if tokenizer is not None:
            record_tokenizer(journal, tokenizer)
        rollout = journaled(_rollout(tokenizer or tiny_tokenizer(), PROMPTS), journal, "cache")
        for step in steps:
            rollout(PROMPTS[:2], step=step)


def test_a_tokenizer_built_in_the_script_decodes_show_text_with_no_flag(tmp_path, tokenizer):
    path = str(tmp_path / "j")
    _record(path, tokenizer)
    done = run_cli("show", path, "1", "--text", "--json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    samples = json.loads(done.stdout)["samples"]
    assert [s["prompt"] for s in samples] == PROMPTS[:2]
    ids = tokenizer(PROMPTS[0])["input_ids"][::-1]
    assert samples[0]["response"] == tokenizer.decode(ids) and samples[0]["truncated"] is False  # eos read back
    shown = run_cli("show", path, "1", "--text")
    assert shown.returncode == 0 and "  prompt:   count one" in shown.stdout.splitlines(), shown.stdout


def test_the_tokenizer_is_stored_once_per_content_and_the_latest_decodes(tmp_path, tokenizer):
    path = str(tmp_path / "j")
    _record(path, tokenizer)
    _record(path, tokenizer, steps=(2,))  # a second session, the same tokenizer: nothing more written
    with Journal(path, readonly=True) as journal:
        records = list(journal.events(run="exp", stage=TOKENIZER_STAGE))
        assert len(records) == 1
        loaded = journal_tokenizer(journal, "exp")
        assert loaded.eos_token_id == tokenizer.eos_token_id and loaded.pad_token_id == tokenizer.pad_token_id
        assert loaded.special_tokens["eos_token"] == "<|eos|>"
        assert journal.verify() == []  # the document is a payload like any other: verify, push, pull keep it
        assert journal_tokenizer(journal, "other") is None
    other = tiny_tokenizer()
    other.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    with Journal(path, run="exp") as journal:
        assert record_tokenizer(journal, other) is not None
        assert record_tokenizer(journal, other) is None
    with Journal(path, readonly=True) as journal:
        assert journal_tokenizer(journal, "exp").special_tokens["additional_special_tokens"] == ["<|tool|>"]


def test_a_journal_without_a_tokenizer_shows_ids_with_one_line_saying_how_to_get_text(tmp_path):
    path = str(tmp_path / "j")
    _record(path)
    done = run_cli("show", path, "1", "--text")
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "run 'exp' kept no tokenizer, so ids are shown; for text see docs/reading.md"]
    assert "  response: ids [" in done.stdout and "..." not in done.stdout.split("prompt:", 1)[1].splitlines()[0]
    report = run_cli("report", path, "-o", str(tmp_path / "r.html"))
    assert report.returncode == 0 and len(report.stderr.splitlines()) == 1 and "kept no tokenizer" in report.stderr


def test_a_journal_recorded_before_tokenizers_were_kept_still_reads_with_tokenizer_path(tmp_path, tokenizer):
    path, folder = str(tmp_path / "j"), tmp_path / "tok"
    tokenizer.save_pretrained(folder)
    _record(path)
    done = run_cli("show", path, "1", "--text", "--tokenizer", str(folder), "--json")
    assert done.returncode == 0 and [s["prompt"] for s in json.loads(done.stdout)["samples"]] == PROMPTS[:2]
    with Journal(str(tmp_path / "named"), run="exp", fingerprint={"tokenizer": str(folder)}) as journal:
        journal.record(1, {"prompt_ids": [[5, 6]], "completion_ids": [[7]]})
    named = run_cli("show", str(tmp_path / "named"), "1", "--text", "--json")  # the fingerprint names it
    assert named.returncode == 0 and json.loads(named.stdout)["samples"][0]["prompt"] == tokenizer.decode([5, 6])


def _hostile(path: str, document) -> None:
    with Journal(path, run="exp") as journal:
        journal.record(0, document, mode=TOKENIZER_STAGE, stage=TOKENIZER_STAGE)
        journal.record(1, {"prompt_ids": [[5, 6]], "completion_ids": [[7, 8]]})


GOOD = {"format": "stepjournal.tokenizer", "version": 1, "tokenizer_json": "{}", "special_tokens": {},
        "chat_template": None}


@pytest.mark.parametrize("document, why", [
    ({**GOOD, "tokenizer_json": '{"model": {"type": "BPE", "vocab": ['}, "the tokenizers library cannot read it"),
    ({**GOOD, "tokenizer_json": 5}, "its tokenizer_json is not text"),
    ({**GOOD, "special_tokens": ["<eos>"]}, "its special_tokens is not a map of names to tokens"),
    ({**GOOD, "version": 99}, "its version 99 is not 1"),
    ({**GOOD, "exec": "import os"}, "it holds unknown keys (exec)"),
    (["stepjournal.tokenizer"], "it is a list, not a dict of strings"),
    (b"\x80\x04\x95 a pickle", "it is a bytes, not a dict of strings"),
])
def test_a_hostile_tokenizer_document_is_refused_in_one_line_and_ids_are_shown(tmp_path, document, why):
    path = str(tmp_path / "j")
    _hostile(path, document)
    done = run_cli("show", path, "1", "--text")
    assert done.returncode == 0, done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("the tokenizer recorded at event #2 is refused: ") and why in line, line
    assert "response: ids [7, 8]" in done.stdout


def test_a_tokenizer_document_past_the_size_bound_is_refused_before_it_is_read(tmp_path, tokenizer, monkeypatch):
    path = str(tmp_path / "j")
    _record(path, tokenizer)
    monkeypatch.setattr(_tokenizer, "MAX_DOCUMENT_BYTES", 1000)
    monkeypatch.setattr(Journal, "load", lambda *a, **k: pytest.fail("a document past the bound was read"))
    with Journal(path, readonly=True) as journal, pytest.raises(TokenizerDocumentError, match="more than the 1000"):
        journal_tokenizer(journal, "exp")


def test_trl_run_with_a_tokenizer_built_in_the_script_shows_text_with_no_flag(tmp_path, tokenizer):
    from trl import GRPOConfig, GRPOTrainer

    from stepjournal.adapters.trl import attach

    trainer = GRPOTrainer(model=tiny_model(tokenizer), reward_funcs=length_reward,
                          args=GRPOConfig(**grpo_args(tmp_path / "out", max_steps=1)),
                          train_dataset=prompts_dataset(), processing_class=tokenizer)
    path = str(tmp_path / "j")
    with Journal(path, run="grpo") as journal:
        attach(trainer, journal, "cache")
        trainer.train()
    done = run_cli("show", path, "0", "--text", "--json")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    samples = json.loads(done.stdout)["samples"]
    assert samples and all(s["prompt"] in PROMPTS for s in samples)
    assert all(s["response"] == tokenizer.decode(s["response_ids"], skip_special_tokens=True) for s in samples)


# -- show pages on a terminal, never in a pipe ---------------------------------------------------------------
def test_show_on_a_terminal_goes_through_the_pager_and_never_in_a_pipe(tmp_path, tokenizer):
    from test_cli_terminal import run_in_pty

    path = str(tmp_path / "j")
    _record(path, tokenizer)
    marker, pager = tmp_path / "paged", tmp_path / "pager.sh"
    pager.write_text(f"#!/bin/sh\necho PAGER-RAN > {marker}\ncat\n")
    pager.chmod(0o755)
    env = {**os.environ, "PAGER": str(pager), "COLUMNS": "80", "TERM": "xterm"}
    for argv in (["show", path, "1"], ["show", path, "1", "--text"]):
        shown = run_in_pty([str(SCRIPT), *argv], env)
        assert marker.read_text() == "PAGER-RAN\n" and "call #0" in shown
        marker.unlink()
        assert "call #0" in run_in_pty([str(SCRIPT), *argv, "--no-pager"], env) and not marker.exists()
        piped = run_cli(*argv, env={"PAGER": str(pager)})
        assert piped.returncode == 0 and "call #0" in piped.stdout and not marker.exists()


def test_show_previews_token_id_lists_inline_as_torch_prints_a_tensor(tmp_path):
    path = str(tmp_path / "j")
    with Journal(path, run="exp") as journal:
        journal.record(1, {"completion_ids": [list(range(100, 120)), [1, 2]], "uid": ["a", "b"]})
    done = run_cli("show", path, "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "│   ├── 0: list (20 items)  [100, 101, 102, ..., 117, 118, 119]" in lines, lines
    assert "│   └── 1: list (2 items)  [1, 2]" in lines
    assert "└── uid: list (2 items)  ['a', 'b']" in lines and len(lines) == 8


# -- show reads a plain payload without torch -----------------------------------------------------------------
def _payloads():
    import numpy as np
    import torch

    return [
        {"prompts": torch.arange(12).reshape(3, 4), "mask": torch.ones(3, 4, dtype=torch.bool),
         "logp": -torch.rand(3, 4), "half": torch.rand(2, dtype=torch.float16), "uid": ["a", "b", "c"],
         "meta": {"t": 1.0, "n": None, 3: (1, "x", b"raw")}, "arr": np.arange(6, dtype=">i4").reshape(2, 3)},
        {"prompt_ids": [[5, 6], [7]], "completion_ids": [list(range(40)), []], "nan": float("nan")},
        [torch.zeros(0, 5), 2 ** 70 - 1 - 2 ** 70 + 2 ** 70],
    ]


@pytest.mark.parametrize("index", range(3))
def test_show_reads_a_plain_payload_as_the_codec_describes_and_decodes_it(tmp_path, index):
    import numpy as np

    from stepjournal.payloads import describe_payload
    from stepjournal.adapters.cli._show_light import light_payload  # private: a CLI helper under test

    value = _payloads()[index]
    with Journal(str(tmp_path / "j")) as journal:
        ref = journal.record(1, value).event.output
        raw = journal.payload_bytes(ref.digest)
        decoded = journal.load(ref)
    light = light_payload(raw, ref.digest, 20)
    if index == 2:  # an int past 64 bits is left to the codec
        assert light is None
        return
    structure, read = light
    assert structure == describe_payload(raw, max_items=20)

    def same(a, b):
        if hasattr(b, "numpy"):
            return np.array_equal(a, b.numpy()) and a.shape == tuple(b.shape)
        if isinstance(b, dict):
            return list(a) == list(b) and all(same(a[k], b[k]) for k in b)
        if isinstance(b, (list, tuple)):
            return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if isinstance(b, np.ndarray):
            return np.array_equal(a, b) and a.dtype == b.dtype
        return a == b or (a != a and b != b)

    assert same(read, decoded)
    assert light_payload(raw, "0" * 64, 20) is None  # a digest that does not hold: the codec's path says so


def test_light_reading_leaves_what_numpy_cannot_show_to_the_codec(tmp_path):
    import torch

    from stepjournal.adapters.cli._show_light import light_payload  # private: a CLI helper under test

    with Journal(str(tmp_path / "j")) as journal:
        for value in ({"x": torch.ones(2, dtype=torch.bfloat16)}, {(1, 2): 3}):
            ref = journal.record(1, value).event.output
            assert light_payload(journal.payload_bytes(ref.digest), ref.digest, 20) is None
        ref = journal.record(2, {"x": [1]}).event.output
        raw = bytearray(journal.payload_bytes(ref.digest))
    raw[-1] ^= 1
    assert light_payload(bytes(raw), ref.digest, 20) is None


def test_show_and_show_text_of_plain_payloads_import_no_torch(tmp_path, tokenizer):
    import subprocess

    path = str(tmp_path / "j")
    _record(path, tokenizer)
    code = ("import sys; from stepjournal.adapters.cli import main; status = main(['show', *sys.argv[1:]]); "
            "print(status, 'torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code, path, "1"], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "0 False", done.stdout + done.stderr
    assert "completion_ids: list (2 items)" in done.stdout
    done = subprocess.run([sys.executable, "-c", code, path, "1", "--text"], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.splitlines()[-1] == "0 False", done.stdout + done.stderr
    assert "  prompt:   count one" in done.stdout.splitlines()


def test_the_kept_tokenizer_is_no_step_a_diff_or_a_report_counts(tmp_path, tokenizer):
    """A second session of the run keeps no second copy; diffing it with the first (or with a journal that kept
    none) still says the runs agree, and the report's steps are the calls' steps only."""
    from stepjournal import diff_journals
    from stepjournal.tools._diff import RUN_STAGES  # private: the diff's internals

    assert TOKENIZER_STAGE in RUN_STAGES
    path, bare = str(tmp_path / "j"), str(tmp_path / "bare")
    _record(path, tokenizer)
    _record(path, tokenizer)
    _record(bare)
    sessions = run_cli("diff", path, path, "--session-a", "s1", "--session-b", "s2")
    assert sessions.returncode == 0, sessions.stdout + sessions.stderr
    with Journal(path, readonly=True) as a, Journal(bare, readonly=True) as b:
        assert diff_journals(a, b).first_divergence is None
        assert [p.stage for p in diff_journals(a, a, stage=TOKENIZER_STAGE).pairs] == [TOKENIZER_STAGE]  # asked for
    done = run_cli("report", path, "-o", str(tmp_path / "r.html"))
    assert done.returncode == 0 and "(1 steps," in done.stdout, done.stdout + done.stderr
