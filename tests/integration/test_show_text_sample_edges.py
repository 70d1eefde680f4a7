"""`show STEP --text --sample S` at its edges, through the real CLI and a real journal: a sample that made no
tool call still shows its assistant text, and a sample the step does not have is named as such (exit 2)."""

from __future__ import annotations

from cli_support import run_cli
from stepjournal import Journal
from test_samples import ids, tokenizer_dir  # noqa: F401  (tokenizer_dir: the fixture)


def _journal(tmp_path, tokenizer_dir):  # noqa: F811
    """A step whose generate call marks a tool's tokens in sample 1 (a raw loop journaled no tool call)."""
    path = str(tmp_path / "agent")
    with Journal(path, run="agent", fingerprint={"tokenizer": tokenizer_dir}) as journal:
        said = ids("two plus two four is four")
        journal.record(1, {"completion_ids": [ids("the cat"), said], "tool_mask": [[1, 1], [1, 1, 1, 0, 1, 1]]})
    return path


def test_a_sample_that_called_no_tool_shows_its_assistant_text(tmp_path, tokenizer_dir):  # noqa: F811
    done = run_cli("show", _journal(tmp_path, tokenizer_dir), "1", "--text", "--sample", "0")
    assert done.returncode == 0, done.stderr
    assert "assistant: the cat" in done.stdout and "no tool calls" in done.stdout, done.stdout


def test_a_sample_the_step_does_not_have_is_refused_naming_how_many_it_has(tmp_path, tokenizer_dir):  # noqa: F811
    done = run_cli("show", _journal(tmp_path, tokenizer_dir), "1", "--text", "--sample", "7")
    assert done.returncode == 2, done
    assert "sample 7" in done.stderr and "2 samples" in done.stderr, done.stderr
