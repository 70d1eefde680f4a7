"""`stepjournal VERB --help` ends with real examples: two or three per verb, each accepted by the parser.
The docs' synopsis lines (``stepjournal audit JOURNAL [--run R] ...``) name only verbs and options the
parser has, and docs/audit.md's completion line, typed in bash, installs the completion.
"""

from __future__ import annotations

import re
import shlex

import pytest

from stepjournal.adapters.cli import _app  # private: a CLI helper under test
from stepjournal.adapters.cli._examples import EXAMPLES  # private: a CLI helper under test
from cli_support import run_cli
from doc_lines import command_lines, run_line

VERBS = sorted(_app.build_parser()._subparsers._group_actions[0].choices)
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z_]*(\.[A-Za-z]+)?$")  # JOURNAL, STEP, A, FILE.png


def is_synopsis(text: str) -> bool:
    """Whether a docs line is a usage line, with placeholders, rather than one to type as it stands."""
    words = [w.strip("[]()|") for w in text.replace("|", " ").split()]
    alternatives = re.search(r"\w\|\w", text) is not None  # bash|zsh (a shell pipe has blanks around it)
    return text.startswith("stepjournal ") and ("[" in text or alternatives or any(_PLACEHOLDER.match(w) for w in words))


SYNOPSES = [line for line in command_lines() if is_synopsis(line.text)]
INSTALL = [line for line in command_lines("docs/audit.md") if line.text == 'eval "$(stepjournal completion bash)"']
DOC_LINES = SYNOPSES + INSTALL


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


def completions(*lines: str, cwd=None) -> list[list[str]]:
    """What bash offers for the last word of each of `lines`, in one shell that sourced the script
    `stepjournal completion bash` prints (docs/audit.md's line, as typed), one after another: each line
    set as bash sets it on a Tab (``COMP_LINE``, ``COMP_POINT``, ``COMP_WORDS``, ``COMP_CWORD``)."""
    (install,) = INSTALL
    script = [install.text]
    for line in lines:
        words = line.split(" ")
        script.append(f"COMP_LINE={shlex.quote(line)}; COMP_POINT={len(line)}; "
                      f"COMP_WORDS=({' '.join(shlex.quote(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
                      'COMPREPLY=(); _python_argcomplete stepjournal; printf "%s\\n" "${COMPREPLY[@]}"; echo @end')
    done = run_line("\n".join(script) + "\n", cwd, timeout=120)
    assert done.returncode == 0, done.stderr
    offered = done.stdout.split("@end\n")
    assert offered[-1] == "" and len(offered) == len(lines) + 1, done.stdout
    return [text.split() for text in offered[:-1]]


def test_bash_completes_verbs_options_remote_actions_and_files(tmp_path):
    (tmp_path / "journal-one").mkdir()
    offered = completions("stepjournal au", "stepjournal di", "stepjournal prune J --keep-",
                          "stepjournal -v diff A B --session-", "stepjournal remote a", "stepjournal completion z",
                          f"stepjournal runs {tmp_path}/journal-o")
    assert offered == [["audit"], ["diff"], ["--keep-last"], ["--session-a", "--session-b"], ["add"], ["zsh"],
                       [f"{tmp_path}/journal-one/"]]


@pytest.fixture
def two_runs(tmp_path):
    """A journal with runs ``exp`` and ``exp-long`` and two sessions (s1, s2), and a file beside it."""
    import torch

    from stepjournal import Journal

    for run in ("exp", "exp-long"):
        with Journal(str(tmp_path / "j"), run=run) as journal:
            journal.record(1, {"ids": torch.arange(2)})
    (tmp_path / "session-notes.txt").write_text("a file a session option must not offer")
    return tmp_path


def test_bash_completes_run_keys_and_session_names_from_the_journal_on_the_line_never_file_names(two_runs):
    offered = completions("stepjournal audit j --run ", "stepjournal audit j --run exp-", "stepjournal diff j j --run-b e",
                          "stepjournal diff j j --session-a ", "stepjournal diff j j --session-b s2",
                          "stepjournal diff missing j --session-a ", "stepjournal audit missing --run ",
                          "stepjournal diff j j --session-a se", cwd=two_runs)
    assert offered == [["exp", "exp-long"], ["exp-long"], ["exp", "exp-long"], ["s1", "s2"], ["s2"], [], [], []]


def test_zsh_completes_natively_with_the_same_script(two_runs):
    """zsh runs argcomplete's own zsh branch: the same program answers, with each option's help beside it
    (`_describe`, which shows the choices on a Tab, is replaced here by a print of what it was given)."""
    import os
    import shutil
    import subprocess
    import sys

    zsh = shutil.which("zsh")
    assert zsh, "the zsh completion test needs zsh: apt-get install zsh (make test installs it as root)"
    script = (
        "autoload -U +X compinit && compinit -u\n"
        f'eval "$({os.path.dirname(sys.executable)}/stepjournal completion zsh)"\n'
        'print -r -- "registered: $_comps[stepjournal]"\n'
        '_describe() { print -rl -- "${(@P)2}"; }\n'
        'offer() { BUFFER="$1"; CURSOR=${#BUFFER}; words=(${=BUFFER}); _python_argcomplete; print -- @end; }\n'
        'offer "stepjournal diff j j --session-"\n'
        'offer "stepjournal diff j j --session-a "\n'
        'offer "stepjournal audit j --run "\n'
    )
    env = {**os.environ, "HOME": str(two_runs), "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run([zsh, "-c", script], capture_output=True, text=True, timeout=120, cwd=two_runs, env=env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "registered: _python_argcomplete"
    offered = [[w.split(":")[0] for w in part.strip().splitlines()] for part in "\n".join(lines[1:]).split("@end")[:-1]]
    assert offered == [["--session-a", "--session-b"], ["s1", "s2"], ["exp", "exp-long"]]


def synopsis_problems(lines) -> list:
    """What is wrong with each synopsis line: a verb the parser lacks, or an ``--option`` / ``-o`` that
    neither the verb nor the command line before it accepts."""
    parser = _app.build_parser()
    verbs = parser._subparsers._group_actions[0].choices
    top = {o for action in parser._actions for o in action.option_strings}
    wrong = []
    for line in lines:
        words = [w.strip("[]()|") for w in str(line.text).replace("|", " ").split()]
        words = [w for w in words if w]
        while len(words) > 2 and words[1].startswith("-"):  # options given before the verb
            if words[1] not in top:
                wrong.append(f"{line}: stepjournal has no option {words[1]}")
            del words[1]
        verb = words[1]
        if verb not in verbs:
            wrong.append(f"{line}: no verb {verb!r}")
            continue
        known = top | {o for action in verbs[verb]._actions for o in action.option_strings}
        wrong += [f"{line}: {verb} has no option {w}" for w in words[2:] if w.startswith("-") and w not in known]
    return wrong


def test_the_docs_have_synopsis_lines_and_each_names_a_verb_and_options_the_parser_has():
    assert len(SYNOPSES) >= 20
    assert not synopsis_problems(SYNOPSES)


def test_a_synopsis_with_a_missing_verb_or_option_is_found():
    from doc_lines import DocLine

    assert is_synopsis("stepjournal audit JOURNAL [--run R]") and not is_synopsis("stepjournal audit j --run exp")
    assert is_synopsis("stepjournal completion bash|zsh") and not is_synopsis("stepjournal audit j | head -1")
    planted = [DocLine("docs/x.md", 1, "stepjournal audit JOURNAL [--runn R] [-n N]"),
               DocLine("docs/x.md", 2, "stepjournal audits JOURNAL"),
               DocLine("docs/x.md", 3, "stepjournal -v audit JOURNAL [--run R | --json]")]
    assert synopsis_problems(planted) == ["docs/x.md:1: stepjournal audit JOURNAL [--runn R] [-n N]: audit has no option --runn",
                                          "docs/x.md:2: stepjournal audits JOURNAL: no verb 'audits'"]


def test_each_verb_is_one_module_holding_its_arguments_and_run_and_only_the_run_verb_is_imported():
    import importlib
    import json
    import subprocess
    import sys

    assert set(_app.VERBS) == set(VERBS)
    for name, (module, _) in _app.VERBS.items():
        verb = importlib.import_module(f"stepjournal.adapters.cli._{module}")
        assert callable(verb.add_arguments) and callable(verb.run), name
    code = ("import sys\nfrom stepjournal.adapters.cli._app import build_parser\n"
            "build_parser(['audit']).parse_args(['audit', 'J'])\n"
            "import json\nprint(json.dumps([m.rsplit('._', 1)[1] for m in sys.modules if m.startswith('stepjournal.adapters.cli._')]))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(json.loads(done.stdout))
    verbs = {module for module, _ in _app.VERBS.values()}
    assert loaded & verbs == {"audit"}, loaded
