"""The `stepjournal` command line in a terminal and a pipe: widths, pager, closed pipes, option order, errors.

Every test runs the real program in a subprocess (`python -m stepjournal` or the installed script),
with a terminal width set through ``COLUMNS`` or a real pseudo-terminal where a TTY matters.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from stepjournal import Journal
from stepjournal.tools import DIFF_SCHEMA_VERSION
from stepjournal.tools import AUDIT_FIELDS
from cli_support import CLI, run_cli, start_cli
from terminal import on_a_terminal

SCRIPT = Path(sys.executable).with_name("stepjournal")


def cli(*args: str, columns: int | None = None, **env: str) -> subprocess.CompletedProcess:
    """The command without a width or a pager of this process's (`columns`, `env`: this command's own)."""
    return run_cli(*args, env={"COLUMNS": None if columns is None else str(columns), "PAGER": None, **env})


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, f"{result.args} failed ({result.returncode}):\n{result.stderr}"
    assert result.stderr == "", result.stderr
    return result.stdout


def build(path: str, steps: int = 40) -> str:
    """Session 1 records steps 1-`steps`/2; session 2 replays them and repeats them into the second half,
    then is refused at a step far past the end; a validation call is bypassed."""
    half = steps // 2
    with Journal(path, run="exp", fingerprint={"model": "tiny"}) as j:
        for step in range(1, half + 1):
            j.record(step, {"ids": torch.full((2, 3), step)}, policy="dump@1-20",
                     reason=f"dump: step {step} is in steps 1-{half}, generate and store")
        j.record_bypass(3, mode="validate", policy="bypass", reason="validation")
    with Journal(path, run="exp", fingerprint={"model": "tiny"}) as j:
        for step in range(1, half + 1):
            j.record_replay(step, j.lookup(step), policy="replay@1-20", reason=f"replay: recorded at step {step}")
        for step in range(half + 1, steps + 1):
            source = (step - half - 1) % 5 + 1
            j.record_replay(step, j.lookup(source), policy="repeat",
                            reason=f"repeat: step {step} -> recorded step {source} of 5 in steps 1-5")
        j.record_refusal(1000, policy="replay", reason="replay miss: nothing recorded at step 1000")
    return path


@pytest.fixture(scope="module")
def journal(tmp_path_factory) -> str:
    return build(str(tmp_path_factory.mktemp("terminal") / "journal"))


def display_width(line: str) -> int:
    return len(line.rstrip("\n"))


# -- audit fits the terminal ----------------------------------------------------------------------------
@pytest.mark.parametrize("columns", [80, 120])
def test_the_default_audit_view_fits_the_terminal_one_line_per_call(journal, columns):
    out = ok(cli("audit", journal, columns=columns))
    lines = out.splitlines()
    assert lines[0] == f"generate calls in {journal}"  # whole on one line, however long, to copy
    assert all(display_width(line) <= columns for line in lines[1:]), max(lines[1:], key=len)
    rows = [line for line in lines[:-1] if line.split()[:1] and line.split()[0].isdigit()]
    assert len(rows) == 62  # every call on exactly one line
    header = lines[1].split()
    assert header[:6] == ["step", "call", "action", "source", "policy", "sess"]
    repeat = next(line for line in rows if line.split()[0] == "21")
    assert repeat.split()[1:6] == ["#0", "replayed", "1#0", "repeat", "s2"]
    assert lines[-1] == "62 calls"


def test_audit_wide_shows_all_fourteen_columns(journal):
    out = ok(cli("audit", journal, "--wide", columns=250))
    header = out.splitlines()[1].split()
    assert header[:4] == ["#", "session", "run", "mode"] and "digest" in header and "size" in header
    assert "time" in header and len(out.splitlines()[1].split("  ")) > 1


def test_a_journal_path_wider_than_the_terminal_stays_whole_on_the_title_line(journal, tmp_path):
    longer = tmp_path / ("a-folder-name-wider-than-the-terminal-" * 3)  # a link: the title shows the path given
    longer.symlink_to(journal)
    for flags in ((), ("--summary",)):
        lines = ok(cli("audit", str(longer), *flags, columns=80)).splitlines()
        assert lines[0].startswith(f"generate calls in {longer}") and len(lines[0]) > 80, lines[:2]
        assert all(display_width(line) <= 80 for line in lines[1:]), max(lines[1:], key=len)


def test_each_result_line_keeps_a_path_wider_than_the_terminal_whole(journal, tmp_path):
    """The line that says where a verb wrote (or read) names the path whole at any width, to copy."""
    base = tmp_path / ("a-folder-name-wider-than-the-terminal-" * 3)
    base.mkdir()
    copy, remote = base / "journal", base / "remote"
    shutil.copytree(journal, copy)
    said = {
        "push": (["push", str(copy), str(remote)], f"of journal {{}} to {remote}"),
        "push again": (["push", str(copy), str(remote)], f"{remote} is up to date"),
        "clone": (["clone", str(remote), str(base / "cloned")], f"into {base / 'cloned'}"),
        "pull": (["pull", str(remote), str(base / "cloned")], f"into {base / 'cloned'}"),
        "export --to": (["export", str(copy), "--to", str(base / "out")], f"to {base / 'out'}"),
        "export --bundle": (["export", str(copy), "--bundle", str(base / "b.bundle")], f"into {base / 'b.bundle'}"),
        "prune": (["prune", str(copy), "--keep-last", "2", "--dry-run"], f"in {copy} "),
        "remote add": (["remote", "add", str(copy), "far", str(remote)], f"remote far is file://{remote}"),
        "remote remove": (["remote", "remove", str(copy), "far"], f"removed remote far (file://{remote})"),
    }
    for verb, (argv, whole) in said.items():
        first = ok(cli(*argv, columns=80)).splitlines()[0]
        head, _, tail = whole.partition("{}")
        assert head in first and tail in first and len(first) > 80, (verb, first)


def test_audit_n_prints_the_newest_calls_and_first_the_oldest_in_every_format(journal):
    """``-n N`` counts from the end, as ``git log -n`` does (the newest calls, in log order); ``--first N`` (its
    older name ``--limit``) keeps the oldest."""
    table = ok(cli("audit", journal, "-n", "3", columns=100)).splitlines()
    assert table[0] == f"the newest 3 of the generate calls in {journal}"
    assert table[-1] == "3 calls" and [line.split()[0] for line in table[3:6]] == ["39", "40", "1000"]
    assert ok(cli("audit", journal, "--last", "3", columns=100)).splitlines() == table
    first = ok(cli("audit", journal, "--first", "3", columns=100)).splitlines()
    assert first[-1] == "3 calls" and [line.split()[0] for line in first[3:6]] == ["1", "2", "3"]
    assert ok(cli("audit", journal, "--limit", "3", columns=100)).splitlines() == first
    newest = json.loads(ok(cli("audit", journal, "-n", "2", "--json")))
    assert [row["step"] for row in newest] == [40, 1000]
    assert [row["step"] for row in json.loads(ok(cli("audit", journal, "--limit", "2", "--json")))] == [1, 2]
    rows = list(csv.DictReader(io.StringIO(ok(cli("audit", journal, "--csv", "-n", "4")))))
    assert len(rows) == 4 and list(rows[0]) == list(AUDIT_FIELDS) and rows[-1]["step"] == "1000"
    assert cli("audit", journal, "-n", "2", "--first", "2").returncode == 2  # one or the other


def test_audit_summary_gives_one_line_per_range_of_steps_that_went_alike(journal):
    out = ok(cli("audit", journal, "--summary", "--mode", "train", columns=120))
    lines = out.splitlines()
    assert lines[1].startswith("steps 1-20 generated by dump@1-20 (run exp, train, s1)")
    assert lines[2].startswith("steps 1-20 replayed from 1-20 by replay@1-20 (run exp, train, s2)")
    assert lines[3].startswith("steps 21-40 replayed from 1-5 by repeat (run exp, train, s2)")
    assert lines[4].startswith("steps 1000 refused by replay (run exp, train, s2)")
    assert lines[5] == "61 calls"


def test_audit_of_a_run_that_is_not_there_names_the_runs_that_are(journal):
    result = cli("audit", journal, "--run", "nosuch")
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr == f"stepjournal: error: no run 'nosuch' in {journal}; its runs: 'exp'\n"
    # A run that is there but has no call matching the filters is not an error.
    assert ok(cli("audit", journal, "--run", "exp", "--steps", "500-600", columns=80)).splitlines()[-1] == \
        "no generate call matches"


def test_audit_rows_stream_the_first_screen_before_the_whole_journal_is_read(tmp_path):
    """The first rows reach the reader while the program is still reading a long journal."""
    path = str(tmp_path / "long")
    with Journal(path, run="exp") as j:
        recorded = j.record(1, {"ids": torch.zeros(2)})
        for step in range(2, 6001):
            j.record_replay(step, recorded, policy="repeat", reason="repeat")
    proc = subprocess.Popen([*CLI, "audit", path], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "COLUMNS": "100"})
    try:
        first = proc.stdout.readline() + proc.stdout.readline() + proc.stdout.readline()
        still_running = proc.poll() is None
        rest, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert b"step" in first and still_running, err
    assert rest.decode().splitlines()[-1] == "6000 calls"


# -- a pager on a terminal, never in a pipe -------------------------------------------------------------
def run_in_pty(argv: list[str], env: dict) -> str:
    """Run the installed script (``argv[0]``) with a pseudo-terminal as stdin/stdout/stderr (`terminal.on_a_terminal`);
    return everything it wrote. The command is forked from the prepared interpreter where `run_cli` would fork it
    (`start_cli`)."""
    assert argv[0] == str(SCRIPT), argv
    status, raw = on_a_terminal(lambda i, o, e: start_cli(*argv[1:], stdin=i, stdout=o, stderr=e, env=env), timeout=120)
    assert status == 0, raw
    return raw.decode("utf-8", "replace")


def test_audit_on_a_terminal_goes_through_the_pager_and_never_with_no_pager(journal, tmp_path):
    marker = tmp_path / "paged"
    pager = tmp_path / "pager.sh"
    pager.write_text(f"#!/bin/sh\necho PAGER-RAN > {marker}\ncat\n")
    pager.chmod(0o755)
    env = {**os.environ, "PAGER": str(pager), "COLUMNS": "100", "TERM": "xterm"}
    shown = run_in_pty([str(SCRIPT), "audit", journal, "-n", "5"], env)
    assert marker.read_text() == "PAGER-RAN\n" and "5 calls" in shown and "\x1b[" in shown  # colours kept
    marker.unlink()
    shown = run_in_pty([str(SCRIPT), "audit", journal, "-n", "5", "--no-pager"], env)
    assert not marker.exists() and "5 calls" in shown
    # Not a terminal: no pager, whatever PAGER says.
    ok(cli("audit", journal, "-n", "5", PAGER=str(pager)))
    assert not marker.exists()


def test_diff_on_a_terminal_goes_through_the_pager_and_fits_its_width(journal, tmp_path):
    import re

    marker = tmp_path / "paged"
    pager = tmp_path / "pager.sh"
    pager.write_text(f"#!/bin/sh\necho PAGER-RAN > {marker}\ncat\n")
    pager.chmod(0o755)
    first, second = session_ids(journal)[:2]
    argv = [str(SCRIPT), "diff", journal, journal, "--session-a", first[:8], "--session-b", second[:8], "--steps", "1-20"]
    env = {**os.environ, "PAGER": str(pager), "COLUMNS": "80", "TERM": "xterm"}
    shown = run_in_pty(argv, env)
    plain = re.sub(r"\x1b\[[0-9;]*m", "", shown)
    assert marker.read_text() == "PAGER-RAN\n" and "runs agree: 20 pairs over steps 1-20 are equal" in plain
    assert max(len(line) for line in plain.replace("\r", "").splitlines() if journal not in line) <= 80, plain
    marker.unlink()
    assert "20 pairs" in run_in_pty(argv + ["--no-pager"], env) and not marker.exists()


@pytest.mark.parametrize("columns", [None, 80])
def test_output_to_a_pipe_carries_no_table_padding(journal, columns):
    first, second = session_ids(journal)[:2]
    verbs = {
        "runs": ("runs", journal),
        "audit": ("audit", journal),
        "show": ("show", journal, "3"),
        "diff": ("diff", journal, journal, "--session-a", first[:8], "--session-b", second[:8]),
        "prune": ("prune", journal, "--keep-last", "1", "--dry-run"),
        "verify": ("verify", journal),
    }
    for verb, argv in verbs.items():
        done = cli(*argv, columns=columns)
        assert done.returncode in (0, 1) and done.stdout.strip(), (verb, done.stderr)
        padded = [line for line in done.stdout.splitlines() if line != line.rstrip()]
        assert not padded, (verb, padded[:3])
        assert done.stderr == "", (verb, done.stderr)  # no progress bar reaches a pipe


def test_verify_shows_bytes_checked_their_rate_and_time_left_on_a_terminal_only_and_never_with_json(journal):
    import re

    env = {**os.environ, "COLUMNS": "120", "TERM": "xterm", "PAGER": "cat"}
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", run_in_pty([str(SCRIPT), "verify", journal], env)).replace("\r", "\n")
    bars = [line for line in shown.splitlines() if line.startswith("verifying")]
    assert bars and not any("?" in line for line in bars), bars  # no bar before the total is known
    done, total, unit = re.search(r"([\d.]+)/([\d.]+) (bytes|kB|MB|GB)", bars[-1]).groups()
    assert done == total, bars[-1]
    assert re.search(r"\d[\d.]* (bytes|kB|MB|GB)/s", bars[-1]), bars[-1]
    assert re.search(r"elapsed \d+:\d\d:\d\d\s+left \d+:\d\d:\d\d\s*$", bars[-1]), bars[-1]
    assert "verifying" not in run_in_pty([str(SCRIPT), "verify", journal, "--json"], env)
    assert cli("verify", journal).stderr == ""  # piped: nothing


def test_sharing_verbs_show_events_bytes_rate_and_time_left_on_a_terminal_only(journal, tmp_path):
    """push, clone, export (a bundle, or tensors --to a folder) and import: the bar ends with every event (or
    call) done, the bytes moved (of all, for a clone and an import), their rate, and the labelled time elapsed
    and left; with --json, or piped, nothing reaches stderr."""
    import json
    import re

    from stepjournal.adapters.cli._render import human_size  # private: a CLI helper under test

    env = {**os.environ, "COLUMNS": "160", "TERM": "xterm", "PAGER": "cat"}
    remote, bundle = f"file://{tmp_path / 'remote'}", str(tmp_path / "j.sjb")
    verbs = [
        ("push", ["push", journal, remote]),
        ("pull", ["clone", remote, str(tmp_path / "b")]),
        ("bundle", ["export", journal, "--bundle", bundle]),
        ("pull", ["import", bundle, str(tmp_path / "imported")]),  # a bundle is read as a remote is pulled
        ("export", ["export", journal, "--to", str(tmp_path / "tensors")]),
    ]
    for label, argv in verbs:
        shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", run_in_pty([str(SCRIPT), *argv], env)).replace("\r", "\n")
        bars = [line for line in shown.splitlines() if re.match(rf"{label}\b.* \d+/\d+ ", line)]
        assert bars, (label, shown)
        done, total = map(int, re.search(r"(\d+)/(\d+)", bars[-1]).groups())
        assert done == total > 0, bars[-1]
        # a push, a pull (a clone, an import) know the bytes they move: those moved of all of them
        size = r"([\d.,]+)/([\d.,]+) (bytes|kB|MB)" if label in ("pull", "push") else r"\d[\d.]* (bytes|kB|MB)"
        moved = re.search(rf"events {size} \d[\d.]* (bytes|kB|MB|GB)/s", bars[-1])
        assert moved and (label not in ("pull", "push") or moved.group(1) == moved.group(2)), bars[-1]
        assert re.search(r"elapsed \d+:\d\d:\d\d\s+left \d+:\d\d:\d\d\s*$", bars[-1]), bars[-1]
    # At 80 columns the bar gives up its width, never the words: one line, labelled times.
    narrow = {**env, "COLUMNS": "80"}
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", run_in_pty([str(SCRIPT), "clone", remote, str(tmp_path / "n")],
                                                         narrow)).replace("\r", "\n")
    bars = [line for line in shown.splitlines() if line.startswith("pull ")]
    assert bars and all(len(line.rstrip()) <= 80 and re.search(r"elapsed \d+:\d\d:\d\d left", line)
                        for line in bars), bars
    # The bytes on the bar are those the verb reports: push once more, into a fresh remote, with --json too.
    fresh = f"file://{tmp_path / 'fresh'}"
    reported = json.loads(cli("push", journal, fresh, "--json").stdout)["bytes_sent"]
    shown = run_in_pty([str(SCRIPT), "push", journal, f"file://{tmp_path / 'fresh2'}"], env)
    assert human_size(reported) in shown
    for argv in (["push", journal, f"file://{tmp_path / 'fresh3'}", "--json"],
                 ["clone", remote, str(tmp_path / "c"), "--json"], ["import", bundle, str(tmp_path / "d"), "--json"]):
        target = argv[2][len("file://"):] if argv[2].startswith("file://") else argv[2]
        assert not re.search(r"(push|pull|bundle) .*\d+/\d+", run_in_pty([str(SCRIPT), *argv], env)), argv
        shutil.rmtree(target)
        piped = cli(*argv[:-1])
        assert piped.returncode == 0 and piped.stderr == "", (argv, piped.stderr)


@pytest.mark.parametrize("columns", [80, 120])
def test_every_table_verb_fits_the_terminal_in_a_pseudo_terminal(journal, columns):
    """runs, audit, diff, prune --dry-run and show at 80 and 120 columns: no line is wider (--wide overflows:
    tests/integration/test_cli_tables.py)."""
    import re

    env = {**os.environ, "COLUMNS": str(columns), "TERM": "xterm", "PAGER": "cat"}
    views = {
        "runs": ["runs", journal], "audit": ["audit", journal],
        "diff": ["diff", journal, journal, "--session-a", "s1", "--session-b", "s2", "--steps", "1-20"],
        "prune": ["prune", journal, "--keep-last", "1", "--dry-run"], "show": ["show", journal, "3"],
    }
    for view, argv in views.items():
        shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", run_in_pty([str(SCRIPT), *argv], env)).replace("\r", "")
        lines = shown.splitlines()  # a line naming the journal keeps its path whole, however long: the others fit
        assert len(lines) >= 2 and max(len(line) for line in lines if journal not in line) <= columns, (view, shown)
    table = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", run_in_pty([str(SCRIPT), "runs", journal], env))
    # One name per session everywhere: the runs table names them as audit and diff take them.
    assert re.search(r"^s1 .* exp", table, re.M) and re.search(r"^s2 .* exp", table, re.M)


# -- closed pipes, option order --------------------------------------------------------------------------
@pytest.mark.parametrize("verb", [["audit", "--csv"], ["audit"], ["runs", "--json"], ["show", "1"], ["diff", "J"]])
def test_a_reader_that_goes_away_ends_the_program_quietly(journal, verb):
    """``stepjournal audit J --csv | head -1``: no message, the status of a process ended by SIGPIPE."""
    rest = [journal if word == "J" else word for word in verb[1:]]
    out_r, out_w = os.pipe()
    os.close(out_r)  # the reader is gone before the program starts, so before its first line
    err_r, err_w = os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    proc = start_cli(verb[0], journal, *rest, stdin=stdin, stdout=out_w, stderr=err_w,
                     env={**os.environ, "COLUMNS": "80"})
    for fd in (stdin, out_w, err_w):
        os.close(fd)
    with os.fdopen(err_r, "rb") as stderr:
        err = stderr.read()
    assert proc.wait(timeout=120) == 141 and err == b""


def test_global_options_work_before_and_after_the_verb(journal):
    before = cli("-v", "audit", journal, "-n", "1", columns=100)
    after = cli("audit", journal, "-n", "1", "-v", columns=100)
    assert before.returncode == after.returncode == 0
    assert before.stdout == after.stdout
    assert ok(cli("runs", journal, "--verbose", "--json"))  # any verb
    assert cli("audit", journal, "-vv", "-n", "1").returncode == 0


# -- runs, verify, import-verl, plugins ---------------------------------------------------------------------
def test_runs_step_span_leaves_out_refused_calls(journal):
    (run,) = json.loads(ok(cli("runs", journal, "--json")))
    assert (run["first_step"], run["last_step"]) == (1, 40)
    assert run["counts"]["refused"] == 1
    assert " 1-40 " in ok(cli("runs", journal, columns=200))


def test_verify_names_every_step_that_served_a_damaged_payload(tmp_path):
    from lmdb_raw import flip_byte

    path = build(str(tmp_path / "j"))
    with Journal(path, readonly=True) as j:
        digest = j.lookup(2, run="exp").event.output.digest
    flip_byte(path, "payloads", key=bytes.fromhex(digest))
    result = cli("verify", path, "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    (problem,) = [p for p in report["problems"] if p["kind"] == "payload"]
    # recorded at step 2, replayed at step 2, repeated into steps 22, 27, 32, 37
    assert problem["steps"] == [2, 22, 27, 32, 37] and report["affected_steps"] == [2, 22, 27, 32, 37]
    table = cli("verify", path, columns=200)
    assert "journal is damaged; affected steps: 2,22,27,32,37" in table.stdout


def test_an_error_from_verify_itself_does_not_tell_the_user_to_run_verify(tmp_path):
    from lmdb_raw import put_raw

    path = build(str(tmp_path / "j"), steps=4)
    put_raw(path, "events", (1).to_bytes(8, "big"), b"\xc1 not msgpack")
    audit = cli("audit", path)
    assert audit.returncode == 1 and f"run `stepjournal verify {path}`" in audit.stderr
    verify = cli("verify", path)
    assert "stepjournal verify" not in verify.stderr and "Traceback" not in verify.stderr


def test_every_json_output_carries_the_schema_version(journal, tmp_path):
    remote = (tmp_path / "remote").as_uri()
    outputs = {
        "runs": cli("runs", journal, "--json"),
        "audit": cli("audit", journal, "--json"),
        "show": cli("show", journal, "3", "--json"),
        "verify": cli("verify", journal, "--json"),
        "plugins": cli("plugins", "--json"),
        # import-verl --json: tests/integration/test_verl_import.py (an empty folder is an error, not a report).
        "prune": cli("prune", journal, "--keep-last", "1", "--dry-run", "--json"),
        "compact": cli("compact", journal, "--to", str(tmp_path / "compacted"), "--json"),
        "push": cli("push", journal, remote, "--json"),
        "pull": cli("pull", remote, str(tmp_path / "pulled"), "--json"),
        "clone": cli("clone", remote, str(tmp_path / "cloned"), "--json"),
        "diff": cli("diff", journal, journal, "--session-a", session_ids(journal)[0][:8], "--session-b",
                    session_ids(journal)[1][:8], "--steps", "1-20", "--json"),
    }
    for verb, result in outputs.items():
        assert result.returncode in (0, 1), (verb, result.stderr)
        data = json.loads(result.stdout)
        objects = data if isinstance(data, list) else [data]
        assert all(o["schema_version"] == (DIFF_SCHEMA_VERSION if verb == "diff" else 1) for o in objects), verb


def session_ids(path: str) -> list[str]:
    with Journal(path, readonly=True) as j:
        return [opened.session for _, opened in j.sessions()]


def test_plugins_lists_installed_policy_plugins_and_whether_each_loads(tmp_path):
    """A plugin installed the way pip installs one (a dist-info with an entry point), one that loads and
    one whose module is missing."""
    site = tmp_path / "site"
    dist = site / "demo_plugins-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-plugins\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[stepjournal.policies]\ngood = demo_plugin_mod:Always\nbroken = no_such_module_xyz:make\n")
    (site / "demo_plugin_mod.py").write_text(
        "import attrs\n"
        "from stepjournal.policies import GenerateCall\n"
        "@attrs.frozen\n"
        "class Always:\n"
        "    name: str = attrs.field(default='good', init=False)\n"
        "    def decide(self, ctx, view):\n"
        "        return GenerateCall(reason='good: generate')\n")
    env = {"PYTHONPATH": str(site), "COLUMNS": "160"}
    listed = json.loads(cli("plugins", "--json", **env).stdout)
    by_name = {p["name"]: p for p in listed}
    assert by_name["good"]["loads"] is True and by_name["good"]["distribution"] == "demo-plugins"
    assert by_name["broken"]["loads"] is False and "no_such_module_xyz" in by_name["broken"]["error"]
    table = cli("plugins", **env)
    assert table.returncode == 1 and "good" in table.stdout and "no_such_module_xyz" in table.stdout
    none = cli("plugins", STEPJOURNAL_DISABLE_PLUGIN_AUTOLOAD="1")
    assert none.returncode == 0 and "no policy plugins" in none.stdout


# -- start-up ----------------------------------------------------------------------------------------------
def test_help_and_version_load_nothing_heavy_beyond_the_package_itself():
    """`stepjournal --help` and `--version` add no table, tensor or plotting module to what
    `import stepjournal` loads (which is torch today, through the journal's codec and diff modules)."""
    code = (
        "import sys, io, contextlib\n"
        "import stepjournal.base._log  # the package and its logging\n"
        "before = set(sys.modules)\n"
        "from stepjournal.adapters.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
        "    assert main(['--help']) == 0 and main(['--version']) == 0\n"
        "assert 'plugins' in out.getvalue() and 'diff' in out.getvalue()\n"
        "new = set(sys.modules) - before\n"
        "heavy = [m for m in new if m.split('.')[0] in ('torch', 'numpy', 'matplotlib', 'safetensors')\n"
        "         or m in ('rich.table', 'rich.tree', 'rich.progress', 'rich.box')]\n"
        "assert not heavy, heavy\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
