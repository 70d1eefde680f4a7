"""Every command line of the docs is held by a test: run as typed through a shell, or, for a usage line,
checked against the parser (tests/doc_lines.py says what a command line is).

Each module below runs (or checks) the lines it names in its ``DOC_LINES``, taken from the page by
`doc_lines.command_lines`, never copied; a line no module names is a line nobody runs, and fails here.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from doc_lines import DocLine, block_lines, command_lines

# The modules that run docs lines, each with what it does with them.
RUNNERS = {
    "test_docs_commands": "docs/audit.md's lines on the demo journal, and verify of a damaged copy",
    "test_readme": "the README's reading of the demo journal and its activation line",
    "test_cli_help": "the synopsis lines (verbs and options the parser has) and the completion line",
    "test_timeline": "audit.md's timeline line with a hidden source",
    "test_samples": "reading.md's show --text and diff --text lines",
    "test_export_tensorboard": "reading.md's report --session and export --tensorboard lines",
    "test_trl_diff": "diff.md's diff of two TRL runs",
    "test_named_remotes": "sharing.md's named-remote session against moto",
    "test_trl_multinode": "sharing.md's TRL topology lines, on their machines",
    "test_verl_multinode": "sharing.md's verl topology lines, on their machines",
    "test_verl_v1_commands": "verl.md's and stages.md's verl lines, through bash and verl's Hydra",
    "test_docs_install": "the install, make, benchmark and test-suite lines (README, quickstart, performance, "
                         "reliability, sharing)",
    "test_docs_sharing_lines": "sharing.md's push/pull/clone, bundle and import lines against moto",
    "test_docs": "```console continuation lines, in the folder of the python block before (trl.md's audit)",
    "test_diff_docs": "diff.md's example diff, in a folder holding the example's journal",
    "test_verl_v1_stages": "verl.md's diff of two V1 replays",
    "test_verl_v1_e2e": "verl.md's import-verl line on the V1 trainer's own dumps",
    "test_trl_env": "trl.md's no-edit lines (STEPJOURNAL=... python -m stepjournal.adapters.trl), through bash",
    "test_trl_tools": "agents.md's TRL tool lines (record, replay, live, changed, audit), through bash",
    "test_verl_config_cli": "verl.md's verl-config line, through bash, its printed overrides through verl's Hydra",
}


TESTS = Path(__file__).resolve().parent.parent


def runner(name: str):
    """The test module `name`, from whichever tier's folder holds it (the folder joins ``sys.path`` first,
    so the import does not depend on which test files ran before)."""
    (path,) = TESTS.glob(f"*/{name}.py")
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    return importlib.import_module(name)


def held_lines() -> dict:
    """Each line some runner names, with the runner."""
    held = {}
    for name in RUNNERS:
        for line in runner(name).DOC_LINES:
            held.setdefault(line, name)
    return held


def test_every_command_line_of_the_docs_is_run_or_checked_by_a_named_test():
    lines = command_lines()
    assert len(lines) >= 100
    held = held_lines()
    nobody = [str(line) for line in lines if line not in held]
    assert not nobody, "docs command lines no test runs:\n" + "\n".join(nobody)


def test_each_runner_names_lines_that_are_on_the_pages_now():
    lines = set(command_lines())
    for name in RUNNERS:
        named = runner(name).DOC_LINES
        assert named, f"{name} names no docs line"
        assert set(named) <= lines, (name, set(named) - lines)


@pytest.mark.parametrize("info, body, expected", [
    ("console", "$ stepjournal runs j\nrun  calls\nexp  3\n$ stepjournal audit j\n", [(0, "stepjournal runs j"),
                                                                                  (3, "stepjournal audit j")]),
    ("console", "make demo   # builds .venv\n\n# a comment\nmake test\n", [(0, "make demo"), (3, "make test")]),
    ("console", "python -m verl.trainer.main_ppo \\\n  a=1 \\\n  \"b='c;d'\"\n", [
        (0, "python -m verl.trainer.main_ppo a=1 \"b='c;d'\"")]),
    ("text", "adapters\n  journal\n", []),
    ("", "stepjournal runs j\n", []),
    ("text", "$ stepjournal diff a b\nruns agree\n", [(0, "stepjournal diff a b")]),
])
def test_a_command_line_is_a_prompted_line_or_a_line_of_a_shell_block(info, body, expected):
    assert block_lines(info, body) == expected


def test_lines_keep_their_page_and_line_number(tmp_path, monkeypatch):
    import doc_lines

    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "p.md").write_text("# P\n\n```python\nx = 1\n```\n\n## Two\n\n```console\n$ ls\n```\n")
    monkeypatch.setattr(doc_lines, "ROOT", tmp_path)
    assert command_lines("docs/p.md") == [DocLine("docs/p.md", 10, "ls")]
    assert command_lines("docs/p.md", section="Two") == [DocLine("docs/p.md", 10, "ls")]
    with pytest.raises(ValueError, match="no heading 'Three'"):
        command_lines("docs/p.md", section="Three")
