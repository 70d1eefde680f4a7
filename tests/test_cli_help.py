"""`stepjournal VERB --help` ends with real examples: two or three per verb, each accepted by the parser."""

from __future__ import annotations

import shlex

import pytest

from stepjournal.adapters.cli import _app
from stepjournal.adapters.cli._examples import EXAMPLES
from cli_support import run_cli

VERBS = sorted(_app.build_parser()._subparsers._group_actions[0].choices)


def test_every_verb_has_two_or_three_examples_and_no_example_names_a_missing_verb():
    assert set(EXAMPLES) == set(VERBS)
    assert all(2 <= len(lines) <= 3 for lines in EXAMPLES.values())


@pytest.mark.parametrize("verb", VERBS)
def test_each_example_is_a_command_line_the_parser_accepts(verb):
    parser = _app.build_parser()
    for command, _ in EXAMPLES[verb]:
        words = shlex.split(command.split(" > ")[0])
        assert words[:2] == ["stepjournal", verb], command
        args = parser.parse_args(words[1:])  # a misspelt option is a UsageError here
        assert args.command == verb


def test_help_shows_the_examples():
    done = run_cli("prune", "--help")
    assert done.returncode == 0
    assert "examples:\n  stepjournal prune runs/grpo --keep-last 100 --dry-run\n" in done.stdout


def complete(line: str, shell: str = "bash") -> list[str]:
    """What bash offers for the last word of `line`, with the script `stepjournal completion` prints sourced."""
    import os
    import subprocess
    import sys

    words = line.split(" ")
    script = (f'eval "$({os.path.dirname(sys.executable)}/stepjournal completion {shell})"\n'
              f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}\n"
              '_stepjournal; printf "%s\\n" "${COMPREPLY[@]}"\n')
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_bash_completes_verbs_options_remote_actions_and_files(tmp_path):
    assert complete("stepjournal au") == ["audit"]
    assert set(complete("stepjournal di")) == {"diff"}
    assert complete("stepjournal prune J --keep-") == ["--keep-last"]
    assert complete("stepjournal -v diff A B --session-") == ["--session-a", "--session-b"]
    assert complete("stepjournal remote a") == ["add"]
    assert complete("stepjournal completion z") == ["zsh"]
    (tmp_path / "journal-one").mkdir()
    assert complete(f"stepjournal runs {tmp_path}/journal-o") == [f"{tmp_path}/journal-one"]


def test_zsh_registers_the_same_completion_through_bashcompinit():
    """zsh completes through its bash layer (zsh filters the candidates by what is typed itself)."""
    import os
    import shutil
    import subprocess
    import sys

    zsh = shutil.which("zsh")
    assert zsh, "the zsh completion test needs zsh: apt-get install zsh (.ci/run installs it as root)"
    script = (
        "autoload -U +X compinit && compinit -u\n"
        f'eval "$({os.path.dirname(sys.executable)}/stepjournal completion zsh)"\n'
        'print -r -- "registered: $_comps[stepjournal]"\n'
        "offer() { emulate -L sh; COMP_WORDS=(stepjournal diff A B --session-); COMP_CWORD=4; _stepjournal;"
        ' printf "%s\\n" "${COMPREPLY[@]}"; }\n'
        "offer\n"
    )
    done = subprocess.run([zsh, "-c", script], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": os.environ.get("TMPDIR", "/tmp")})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "registered: _bash_complete -o filenames -F _stepjournal"
    assert {"--session-a", "--session-b"} <= set(lines[1:]) and "audit" not in lines[1:]
