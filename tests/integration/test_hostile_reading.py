"""Reading a journal somebody else wrote runs nothing of theirs and never crashes (issue 47 point 5).

Each journal here is recorded through the public API, as a trainer of unusual habits (or a hostile
colleague) would record it: the verbs that read it end in a result or in one line naming the bad value.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stepjournal import Journal
from cli_support import CLI, run_cli
from folder_shapes import snapshot
from trl_tiny import tiny_tokenizer

@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tokenizer")
    tiny_tokenizer().save_pretrained(folder)
    return str(folder)


def one_line_or_result(done: subprocess.CompletedProcess) -> None:
    """A verb's end on a hostile journal: a result, or one error line (no traceback)."""
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) <= 1, done.stderr
    if done.returncode not in (0, 1):  # diff: 1 when the runs differ; 2 when one side cannot be read
        assert done.stderr.startswith("stepjournal: error: "), done.stderr


# (generate output, reward stage output or None, what the text view shows or the error says)
ODD_SAMPLES = {
    "a 1-D response": ({"responses": torch.tensor([2, 3, 4])}, None, "token ids of shape [3]"),
    "ids as text": ({"response_ids": ["the cat", "sat"]}, None, "token ids given as str 'the cat'"),
    "a 1-D mask": ({"prompts": torch.tensor([[2, 3]]), "responses": torch.tensor([[4, 1]]),
                    "attention_mask": torch.tensor([1, 1, 1, 1])}, None, "attention_mask of shape [4]"),
    "a mask of another shape": ({"prompts": torch.tensor([[2, 3]]), "responses": torch.tensor([[4, 1]]),
                                 "response_mask": torch.tensor([[1, 1, 1]])}, None, "a mask of shape [1, 3]"),
    "a reward as text": ({"response_ids": [[2, 3]]}, {"rewards": ["good"]}, "rewards given as list ['good']"),
    "a reward of 1e308": ({"response_ids": [[2, 3], [3]]}, {"rewards": [1e308, -1e308]}, "reward 1e+308"),
    "rewards that sum past 1e308": ({"response_ids": [[2, 3], [3]]},
                                    {"rewards": torch.tensor([[1e308, 1e308], [-1e308, 0.0]], dtype=torch.float64)},
                                    "reward inf"),
    "a complex reward": ({"response_ids": [[2, 3]]}, {"rewards": torch.tensor([1 + 1j])},
                         "rewards given as Tensor tensor([1.+1.j]): expected real numbers"),
    "complex token-level scores": ({"response_ids": [[2, 3]]}, {"token_level_scores": torch.tensor([[1j, 2j]])},
                                   "rewards given as Tensor"),
    "token id -1": ({"response_ids": [[2, -1]]}, None, "cannot decode (from -1 to 2)"),
    "token id 2**40": ({"response_ids": torch.tensor([[2, 2 ** 40]])}, None, "cannot decode (from 2 to 1099511627776)"),
}


@pytest.mark.parametrize("case", sorted(ODD_SAMPLES))
def test_samples_of_odd_shapes_types_and_values_are_shown_or_named_in_one_line(tmp_path, tokenizer_dir, case):
    output, reward, said = ODD_SAMPLES[case]
    odd, plain = str(tmp_path / "odd"), str(tmp_path / "plain")
    with Journal(odd, run="exp", fingerprint={"tokenizer": tokenizer_dir}) as journal:
        journal.record(1, output)
        if reward is not None:
            journal.record(1, reward, stage="reward")
    with Journal(plain, run="exp", fingerprint={"tokenizer": tokenizer_dir}) as journal:
        journal.record(1, {"response_ids": [[2, 3]]})
        journal.record(1, {"rewards": [0.5]}, stage="reward")
    one_line_or_result(run_cli("show", odd, "1"))  # the payload as it is
    shown = run_cli("show", odd, "1", "--text", env={"COLUMNS": "200"})
    one_line_or_result(shown)
    assert said in (shown.stdout if shown.returncode == 0 else shown.stderr)
    as_json = run_cli("show", odd, "1", "--text", "--json")
    one_line_or_result(as_json)
    if as_json.returncode == 0:  # exact JSON: an infinite reward is null, as the report shows it
        rewards = [s["rewards"]["reward"] for s in json.loads(as_json.stdout)["samples"]]
        assert all(r is None or abs(r) == 1e308 for r in rewards)
    page = tmp_path / "report.html"
    reported = run_cli("report", odd, "-o", str(page))
    one_line_or_result(reported)
    assert reported.returncode == 0 and page.stat().st_size > 0  # the step is there, without its samples
    for a, b in ((plain, odd), (odd, plain)):
        one_line_or_result(run_cli("diff", a, b, "--text", env={"COLUMNS": "200"}))


def test_a_tokenizer_folder_that_names_code_of_its_own_is_refused_without_a_prompt(tmp_path):
    """The fingerprint names a folder whose tokenizer_config.json asks for custom code (auto_map): `show --text`
    and `report` refuse it in one line, ask nothing on stdin (a "y" waits there) and never run it; the ids are
    shown instead (a journal never fails for want of a tokenizer)."""
    folder, ran = tmp_path / "tokenizer", tmp_path / "RAN"
    tiny_tokenizer().save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="OwnTokenizer", auto_map={"AutoTokenizer": [None, "own_code.OwnTokenizer"]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "own_code.py").write_text(
        f"import pathlib\npathlib.Path({str(ran)!r}).write_text('ran')\n"
        "from transformers import PreTrainedTokenizerFast\nclass OwnTokenizer(PreTrainedTokenizerFast):\n    pass\n")
    path = str(tmp_path / "j")
    with Journal(path, run="exp", fingerprint={"tokenizer": str(folder)}) as journal:
        journal.record(1, {"response_ids": [[2, 3]]})
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf")}  # where transformers would copy the code to run it
    for verb in (["show", path, "1", "--text"], ["report", path, "-o", str(tmp_path / "r.html")]):
        done = subprocess.run([*CLI, *verb], input="y\n", capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.startswith(f"cannot load the tokenizer {str(folder)!r}") and "token ids shown" in done.stderr
        assert len(done.stderr.splitlines()) == 1 and "Do you wish" not in done.stdout + done.stderr
        assert not ran.exists()


def test_names_with_control_characters_give_a_well_formed_svg(tmp_path):
    """Run keys, session names, stage names, policies and reasons holding C0 and C1 controls and XML's two
    noncharacters: the SVG `timeline` draws (and the HTML page's inline SVG) parse as XML, the names escaped."""
    import xml.etree.ElementTree as ET

    path = str(tmp_path / "j")
    run = "r\x01\x1b[2J\x0b\x0c<&>\"'\ufffe"
    with Journal(path, run=run, session="s\x04\x7f\x85\x00") as journal:
        recorded = journal.record(1, {"x": torch.ones(2)}, policy="dump\x02", reason="why\x08\uffff")
        journal.record(1, {"x": torch.ones(2)}, stage="reward.\x03\x1f")
        journal.record_replay(2, recorded, policy="repeat\x1a", reason="again\x10")
    svg, page = tmp_path / "t.svg", tmp_path / "t.html"
    for out in (svg, page):
        done = run_cli("timeline", path, "--out", str(out))
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    ET.parse(svg)  # matplotlib draws text as paths, each under a comment holding the text
    assert "\\x01\\x1b[2J" in svg.read_text(encoding="utf-8")  # the run key, its controls shown as escapes
    inline = page.read_text(encoding="utf-8").split('<div class="scroll">\n', 1)[1].split("\n</div>", 1)[0]
    labels = "".join(ET.fromstring(inline).itertext())
    assert "r\\x01\\x1b[2J" in labels and "reward.\\x03\\x1f" in labels and "\\uffff" in labels


def typed_in_a_terminal(shell: str, lines: str) -> str:
    """What an interactive `shell` (bash or zsh, no start files) prints when `lines` are typed into its
    pseudo-terminal, a tab included: its readline (zle) completes as a user's does. Returns at the shell's exit."""
    leader, follower = pty.openpty()
    argv = [shell, "--norc", "--noprofile", "-i"] if shell.endswith("bash") else [shell, "-f", "-i"]
    env = {**os.environ, "PS1": "$ ", "TERM": "dumb", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    proc = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, env=env, start_new_session=True)
    os.close(follower)
    os.write(leader, lines.encode())  # typed ahead: the shell reads each line when it is ready for it
    chunks = []
    while select.select([leader], [], [], 120)[0]:  # the bound is against a hang only
        try:
            data = os.read(leader, 65536)
        except OSError:  # the terminal closed: the shell exited
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=30)
    os.close(leader)
    return b"".join(chunks).decode("utf-8", "replace").replace("\r", "")


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_quotes_a_file_name_with_a_space_a_quote_and_a_dollar(tmp_path, shell):
    """A tab after the start of such a name inserts it whole and quoted: the command gets the name as it is."""
    found = shutil.which(shell)
    assert found, f"the completion test needs {shell}: apt-get install {shell} (make test installs it as root)"
    name = "x y$HOME'q"
    (tmp_path / name).write_text("")
    setup = "autoload -U +X compinit && compinit -u\n" if shell == "zsh" else ""
    shown = typed_in_a_terminal(found, (
        f'{setup}eval "$(stepjournal completion {shell})"\n'
        # What the completed line runs: its words, one a line. A Tab still asks the real program (argcomplete's
        # script runs `stepjournal` with _ARGCOMPLETE set).
        'stepjournal() { if [ -n "${_ARGCOMPLETE-}" ]; then command stepjournal "$@"; else printf "<%s>\\n" "$@"; fi; }\n'
        f"stepjournal runs {tmp_path}/x\t\nexit\n"))
    assert f"<runs>\n<{tmp_path}/{name}>\n" in shown, shown


# -- absurd numbers and malformed URLs: one line, exit 1 or 2 ----------------------------------------------------
TEN_TO_30, DIGITS_5000 = "1" + "0" * 30, "9" * 5000


def numeric_arguments() -> list:
    """(verb, option or positional name, what it takes) for every argument of every verb that reads a number:
    an int type, a float type, step ranges or a size. Read from the parser, so a new one is in the table."""
    from stepjournal.adapters.cli import _app, _common  # private: CLI helpers under test

    found = []
    for verb, parser in sorted(_app.build_parser()._subparsers._group_actions[0].choices.items()):
        for action in parser._actions:
            name = action.option_strings[-1] if action.option_strings else action.dest
            if isinstance(action.type, _common.key_word) or name == "--as":
                continue  # a run, mode or stage: KEY_BASE below (--as: RENAME_VERBS)
            if action.type is not None and action.type is not str:
                found.append((verb, name, action.type.__name__))
            elif action.metavar in ("RANGES", "SIZE") or (action.metavar or "").startswith("FIELD="):
                found.append((verb, name, action.metavar))
    return found


def test_the_table_below_covers_every_numeric_argument():
    assert {(verb, name) for verb, name, _ in numeric_arguments()} == set(NUMERIC_BASE)


# The rest of each command line, `J` the journal and `OUT` a path to write, with `{}` where the value goes.
NUMERIC_BASE = {
    ("audit", "--last"): ["audit", "J", "-n", "{}"],
    ("audit", "--limit"): ["audit", "J", "--first", "{}"],
    ("audit", "--steps"): ["audit", "J", "--steps", "{}"],
    ("show", "step"): ["show", "J", "{}"],
    ("show", "--index"): ["show", "J", "1", "--index", "{}"],
    ("show", "--items"): ["show", "J", "1", "--items", "{}"],
    ("prune", "--keep-last"): ["prune", "J", "--dry-run", "--keep-last", "{}"],
    ("prune", "--max-bytes"): ["prune", "J", "--dry-run", "--max-bytes", "{}"],
    ("prune", "--pin"): ["prune", "J", "--dry-run", "--keep-last", "1", "--pin", "{}"],
    ("report", "--samples"): ["report", "J", "--no-text", "-o", "OUT.html", "--samples", "{}"],
    ("report", "--chars"): ["report", "J", "--no-text", "-o", "OUT.html", "--chars", "{}"],
    ("diff", "--atol"): ["diff", "J", "J", "--atol", "{}"],
    ("diff", "--rtol"): ["diff", "J", "J", "--rtol", "{}"],
    ("diff", "--tol"): ["diff", "J", "J", "--tol", "x=1,{}"],
    ("diff", "--steps"): ["diff", "J", "J", "--steps", "{}"],
    ("export", "--steps"): ["export", "J", "--to", "OUT", "--steps", "{}"],
    ("export", "--samples"): ["export", "J", "--tensorboard", "OUT", "--no-text", "--samples", "{}"],
    ("export", "--chars"): ["export", "J", "--tensorboard", "OUT", "--no-text", "--chars", "{}"],
    ("show", "--sample"): ["show", "J", "1", "--text", "--sample", "{}"],
    ("timeline", "--steps"): ["timeline", "J", "--out", "OUT.html", "--steps", "{}"],
}
ABSURD = {"10**30": TEN_TO_30, "5000 digits": DIGITS_5000, "1e400": "1e400", "a range to 5000 digits": f"1-{DIGITS_5000}"}


@pytest.fixture(scope="module")
def small_journal(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("numbers") / "j")
    with Journal(path, run="exp") as journal:
        journal.record(1, {"x": torch.ones(2)})
        journal.record(2, {"x": torch.ones(2)})
    return path


@pytest.mark.parametrize("value", sorted(ABSURD))
@pytest.mark.parametrize("argument", sorted(NUMERIC_BASE), ids=" ".join)
def test_an_absurd_number_is_a_result_or_a_one_line_error(small_journal, tmp_path, argument, value):
    words = [small_journal if w == "J" else w.replace("OUT", str(tmp_path / "out")) for w in NUMERIC_BASE[argument]]
    done = run_cli(*[w.replace("{}", ABSURD[value]) for w in words])
    assert "Traceback" not in done.stderr and done.returncode in (0, 1, 2), done.stderr[-2000:]
    if done.returncode == 2 or argument[0] != "diff":  # diff: 1 is "the runs differ", with its table
        assert len(done.stderr.splitlines()) == (0 if done.returncode == 0 else 1), done.stderr[-2000:]


def key_arguments() -> set:
    """(verb, option) for every --run, --mode and --stage of every verb (and the like: diff's --run-a), read from
    the parser by the option's name, whatever its type: a flag that skips the key check is found too."""
    from stepjournal.adapters.cli import _app  # private: CLI helpers under test

    return {(verb, option)
            for verb, parser in _app.build_parser()._subparsers._group_actions[0].choices.items()
            for action in parser._actions for option in action.option_strings
            if re.fullmatch(r"--(run|mode|stage)(-[ab])?", option)}


def test_the_table_below_covers_every_run_mode_and_stage_flag():
    assert key_arguments() == set(KEY_BASE)


KEY_BASE = {
    ("audit", "--run"): ["audit", "J", "--run", "{}"],
    ("audit", "--mode"): ["audit", "J", "--mode", "{}"],
    ("audit", "--stage"): ["audit", "J", "--stage", "{}"],
    ("diff", "--mode"): ["diff", "J", "J", "--mode", "{}"],
    ("diff", "--run-a"): ["diff", "J", "J", "--run-a", "{}"],
    ("diff", "--run-b"): ["diff", "J", "J", "--run-b", "{}"],
    ("diff", "--stage"): ["diff", "J", "J", "--stage", "{}"],
    ("export", "--run"): ["export", "J", "--to", "OUT", "--run", "{}"],
    ("export", "--mode"): ["export", "J", "--to", "OUT", "--mode", "{}"],
    ("export", "--stage"): ["export", "J", "--bundle", "OUT.tar", "--stage", "{}"],
    ("prune", "--run"): ["prune", "J", "--dry-run", "--keep-last", "1", "--run", "{}"],
    ("prune", "--mode"): ["prune", "J", "--dry-run", "--keep-last", "1", "--mode", "{}"],
    ("prune", "--stage"): ["prune", "J", "--dry-run", "--keep-last", "1", "--stage", "{}"],
    ("report", "--run"): ["report", "J", "--no-text", "-o", "OUT.html", "--run", "{}"],
    ("runs", "--stage"): ["runs", "J", "--stage", "{}"],
    ("show", "--run"): ["show", "J", "1", "--run", "{}"],
    ("show", "--mode"): ["show", "J", "1", "--mode", "{}"],
    ("show", "--stage"): ["show", "J", "1", "--stage", "{}"],
    ("timeline", "--run"): ["timeline", "J", "--out", "OUT.html", "--run", "{}"],
    ("timeline", "--mode"): ["timeline", "J", "--out", "OUT.html", "--mode", "{}"],
}
# (the value, what the one line says): a filter no key can match is refused, never read as "every stage" (a NUL
# cannot reach a command line; the API refuses it, tests/unit/test_vocabulary_hostile.py)
BAD_KEYS = {"empty": ("", "is not valid: use a non-empty string without NUL"),
            "600 characters": ("k" * 600, "LMDB keys are at most 511 bytes")}


@pytest.mark.parametrize("value", sorted(BAD_KEYS))
@pytest.mark.parametrize("argument", sorted(KEY_BASE), ids=" ".join)
def test_a_run_mode_or_stage_no_key_can_hold_is_refused_in_one_line_through_a_shell(small_journal, tmp_path,
                                                                                      argument, value):
    given, said = BAD_KEYS[value]
    words = [small_journal if w == "J" else w.replace("OUT", str(tmp_path / "out")) for w in KEY_BASE[argument]]
    line = " ".join('"$VALUE"' if w == "{}" else shlex.quote(w) for w in [*CLI, *words])
    before = snapshot(small_journal)
    done = subprocess.run(["bash", "-c", line], env={**os.environ, "VALUE": given}, capture_output=True, text=True)
    assert snapshot(small_journal) == before  # refused before the journal is opened: nothing touched
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr[-2000:])
    assert len(done.stderr.strip().splitlines()) == 1 and argument[1] in done.stderr and said in done.stderr, \
        done.stderr[-2000:]
    assert len(done.stderr) < 1000, done.stderr  # a 600-character run is clipped, not printed back whole
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.html").exists()


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> dict:
    """A journal pushed to a folder remote and exported as a bundle, and a journal to bring them into."""
    top = tmp_path_factory.mktemp("shared")
    with Journal(str(top / "source"), run="exp") as journal:
        journal.record(1, {"x": torch.ones(2)})
    remote = (top / "remote").as_uri()
    for words in (["push", str(top / "source"), remote], ["export", str(top / "source"), "--bundle", str(top / "b")],
                  ["clone", remote, str(top / "into")]):
        assert run_cli(*words).returncode == 0
    return {"R": remote, "B": str(top / "b"), "J": str(top / "into")}


RENAME_VERBS = {"import": ["import", "B", "J", "--as", "{}"], "pull": ["pull", "J", "R", "--as", "{}"],
                "clone": ["clone", "R", "NEW", "--as", "{}"]}
BAD_RENAMES = {"empty": "", "empty old": "=x", "empty new": "exp=", "600 characters": "exp=" + "k" * 600}


@pytest.mark.parametrize("value", sorted(BAD_RENAMES))
@pytest.mark.parametrize("verb", sorted(RENAME_VERBS))
def test_a_run_key_as_no_key_can_hold_is_refused_in_one_line_naming_as(shared, tmp_path, verb, value):
    """``--as NEW`` or ``OLD=NEW`` is a run key: refused as ``--run`` is (exit 2, one line naming ``--as``), before
    anything is read or written."""
    words = [shared.get(w, str(tmp_path / "new") if w == "NEW" else w) for w in RENAME_VERBS[verb]]
    line = " ".join('"$VALUE"' if w == "{}" else shlex.quote(w) for w in [*CLI, *words])
    before = snapshot(shared["J"])
    done = subprocess.run(["bash", "-c", line], env={**os.environ, "VALUE": BAD_RENAMES[value]}, capture_output=True,
                          text=True)
    assert snapshot(shared["J"]) == before and not (tmp_path / "new").exists()
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr[-2000:])
    assert len(done.stderr.strip().splitlines()) == 1 and "argument --as: run key" in done.stderr, done.stderr
    assert len(done.stderr) < 1000, done.stderr


URL_VERBS = {
    "clone": ["clone", "{}", "OUT"],
    "pull": ["pull", "{}", "J"],
    "push": ["push", "J", "{}"],
    "status": ["status", "J", "{}"],
    "remote add": ["remote", "add", "J", "other", "{}"],
}
# (the URL, what the one line says): never the working folder ("") or / (file://) by accident
BAD_URLS = {"an unclosed IPv6 bracket": ("http://[::1", "malformed remote URL 'http://[::1'"),
            "file:// without a path": ("file://", "the remote URL 'file://' names no folder"),
            "an empty URL": ("", "an empty remote URL names no place"),
            "a port past 65535": ("http://[::1]:99999999999999999999/x", "malformed remote URL"),
            "a URL of 70 000 characters": ("http://h/" + "a" * 70_000, "the remote URL 'http://h/aaaa")}


@pytest.mark.parametrize("url", sorted(BAD_URLS))
@pytest.mark.parametrize("verb", sorted(URL_VERBS))
def test_a_malformed_or_empty_url_is_refused_in_one_line_and_writes_nowhere(small_journal, tmp_path, verb, url):
    """Nothing is created where the URL would lead by accident: the working folder ("") or ``/`` (file://)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    words = [small_journal if w == "J" else w.replace("OUT", str(tmp_path / "clone")) for w in URL_VERBS[verb]]
    root_before = set(os.listdir("/"))
    given, said = BAD_URLS[url]
    done = run_cli(*[w.replace("{}", given) for w in words], cwd=cwd)
    assert done.returncode in (1, 2) and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith(f"stepjournal: error: {said}") and len(done.stderr.splitlines()) == 1, done.stderr
    assert list(cwd.iterdir()) == [] and set(os.listdir("/")) == root_before
    assert not (tmp_path / "clone").exists()


# -- a received journal's remotes.json never takes your push to its URL ------------------------------------------
def test_a_remote_name_the_journal_and_you_both_define_is_refused_naming_both_urls(tmp_path):
    """The journal came with ``origin`` (its default) naming a folder of its sender's choosing; you name
    ``origin`` another place. Push, pull and status by that name, or by the default, refuse in one line naming
    both URLs, and nothing is written at either; when both name the same URL, it is used."""
    from stepjournal.sharing import add_remote

    path, theirs, yours = str(tmp_path / "received"), tmp_path / "theirs", tmp_path / "yours"
    with Journal(path, run="exp") as journal:
        journal.record(1, {"x": torch.ones(2)})
    add_remote(path, "origin", str(theirs))  # as the sender left it in the folder
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    assert run_cli("remote", "add", "--global", "origin", str(yours), env=env).returncode == 0
    for words in (["push", path], ["push", path, "origin"], ["pull", "origin", path], ["status", path]):
        done = run_cli(*words, env=env)
        assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
        assert f"remote 'origin' is file://{theirs} in journal {path!r} and file://{yours} in your remotes" \
            in done.stderr
    assert not theirs.exists() and not yours.exists()
    assert run_cli("remote", "remove", "--global", "origin", env=env).returncode == 0
    assert run_cli("remote", "add", "--global", "origin", str(theirs), env=env).returncode == 0
    assert run_cli("push", path, env=env).returncode == 0 and (theirs / "heads").is_dir()  # one URL: no doubt
