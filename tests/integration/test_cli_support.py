"""`run_cli` forks each command from a prepared interpreter (tests/cli_forkserver.py): a forked command
gives the same bytes on stdout and stderr and the same exit status as the same command in a fresh
interpreter, sees its own working folder and environment, and a command whose environment changes what an
interpreter reads at its start gets a fresh one.
"""

from __future__ import annotations

import os

import pytest
import torch

from stepjournal import Journal

from cli_support import FRESH_ENV, forked_commands, run_cli, start_cli
from terminal import on_a_terminal


@pytest.fixture(autouse=True)
def fork_server_on(monkeypatch):
    """These tests are about the forked route: on even where the run asks for fresh interpreters."""
    monkeypatch.delenv(FRESH_ENV, raising=False)


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("support") / "journal")
    with Journal(path, run="r-é") as j:
        for step in (1, 2, 3):
            j.record(step, {"tokens": torch.arange(6 * step).reshape(step, 6), "text": ["ünï", "\u202etrojan"]})
    return path


def commands(path: str) -> list[list[str]]:
    return [
        ["--version"],
        ["audit", "--help"],
        ["runs", path],
        ["audit", path],
        ["audit", path, "--json"],
        ["show", path, "2"],  # decodes a payload: torch
        ["show", path, "9"],  # exit status 1: no such step
        ["verify", path],
        ["audit", path, "--run", "nosuch"],  # exit status 1: no such run
        ["timeline", path],
        ["audit", path, "--steps", "x-"],  # exit status 2: a usage error
        ["no-such-verb"],
    ]


@pytest.mark.parametrize("text", [False, True], ids=["bytes", "text"])
def test_a_forked_command_gives_what_a_fresh_interpreter_gives(journal, text):
    statuses = set()
    # Every command as bytes (exactly what it wrote); as text (decoded as subprocess decodes), the cheap ones.
    for command in commands(journal) if not text else [c for c in commands(journal) if c[0] != "show"]:
        before = forked_commands()
        forked = run_cli(*command, text=text)
        assert forked_commands() == before + 1, f"{command} was not forked"
        fresh = run_cli(*command, text=text, fresh=True)
        assert forked_commands() == before + 1, f"{command} was forked though fresh=True"
        assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr), command
        assert forked.args == fresh.args
        statuses.add(fresh.returncode)
    assert statuses == {0, 1, 2}


def test_a_forked_command_runs_in_its_working_folder_with_its_environment(journal, tmp_path):
    os.symlink(journal, tmp_path / "here")
    for env in ({"COLUMNS": "60"}, {"COLUMNS": None}, {"NO_COLOR": "1", "COLUMNS": "300"}):
        before = forked_commands()
        forked = run_cli("audit", "here", cwd=tmp_path, env=env)
        assert forked_commands() == before + 1
        fresh = run_cli("audit", "here", cwd=tmp_path, env=env, fresh=True)
        assert forked.returncode == 0
        assert (forked.stdout, forked.stderr) == (fresh.stdout, fresh.stderr), env
    # The table is as wide as its cells (53 columns) where no width is given: 40 makes it give way.
    narrow = run_cli("audit", "here", cwd=tmp_path, env={"COLUMNS": "40"}).stdout
    assert max(len(line) for line in narrow.splitlines()) <= 40 < max(len(line) for line in
                                                                      run_cli("audit", "here", cwd=tmp_path).stdout.splitlines())


def test_the_variable_asks_for_fresh_interpreters(journal, monkeypatch):
    monkeypatch.setenv(FRESH_ENV, "1")
    before = forked_commands()
    assert run_cli("audit", journal).returncode == 0
    assert forked_commands() == before


@pytest.mark.parametrize("env", [{"PYTHONIOENCODING": "ascii"}, {"LANG": "C", "LC_ALL": "C"}, {"PYTHONUTF8": "0"}])
def test_a_command_whose_interpreter_would_start_otherwise_gets_a_fresh_one(journal, env):
    before = forked_commands()
    done = run_cli("runs", journal, env=env)
    assert forked_commands() == before, f"{env} was forked"
    assert done.returncode == 0, done.stderr
    if "PYTHONIOENCODING" in env:  # the fresh interpreter's stdout took the variable's encoding
        assert "r-\\xe9" in done.stdout and "r-é" not in done.stdout


def _on_a_terminal(args: list[str], env: dict) -> tuple[bytes, int]:
    """What ``stepjournal ARGS`` writes with a pseudo-terminal as its stdin, stdout and stderr, and its status."""
    status, raw = on_a_terminal(lambda i, o, e: start_cli(*args, stdin=i, stdout=o, stderr=e, env=env), timeout=120)
    return raw, status


def test_a_command_on_a_terminal_writes_the_same_bytes_forked_or_fresh(journal, monkeypatch):
    """Colours, widths and line buffering follow the terminal in a forked command as in a fresh one."""
    env = {**os.environ, "COLUMNS": "90", "TERM": "xterm", "PAGER": "cat"}
    for command in (["audit", journal, "--no-pager"], ["show", journal, "2"], ["show", journal, "9"]):
        before = forked_commands()
        forked = _on_a_terminal(command, env)
        assert forked_commands() == before + 1, f"{command} was not forked"
        monkeypatch.setenv(FRESH_ENV, "1")
        fresh = _on_a_terminal(command, env)
        monkeypatch.delenv(FRESH_ENV)
        assert forked_commands() == before + 1, f"{command} was forked under {FRESH_ENV}=1"
        assert b"\x1b[" in forked[0] or forked[1] != 0, forked
        assert forked == fresh, (command, forked, fresh)
