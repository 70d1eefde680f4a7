"""What a journal holds is somebody else's text: the command line never lets it reach the terminal raw,
and never crashes on a legitimate value (issue 13 points 6 and 11)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from stepjournal import Journal
from cli_support import run_cli

RUN = "r\x1b]0;pwned\x07x\x1b[2J"
REASON = "why\x1b]0;pwned\x07 \x1b[31mred\u202e"
RAW = ("\x1b]0;pwned", "\x1b[2J", "\x1b[31m", "\x07", "\u202e")


def cli(*args: str) -> subprocess.CompletedProcess:
    return run_cli(*args, text=False, env={"COLUMNS": "200"})


@pytest.fixture(scope="module")
def hostile(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("hostile") / "journal")
    with Journal(path, run=RUN, fingerprint={"k\x1b[2J": "v\x1b]0;x\x07"}) as j:
        recorded = j.record(1, {"ids": torch.arange(3), "lone": "a\udc80b", "big": 10 ** 20000, "k\x1b[31m": 1},
                            policy="p\x1b[2J", reason=REASON)
        j.record_replay(2, recorded, policy="repeat\x1b[2J", reason=REASON)
    return path


def assert_no_raw_control(data: bytes) -> None:
    text = data.decode("utf-8")  # also: every byte is valid UTF-8 (a lone surrogate would not be)
    for sequence in RAW:
        assert sequence not in text, repr(sequence)
    assert not any(ord(c) < 0x20 and c not in "\n" for c in text), repr(text[:200])


@pytest.mark.parametrize("argv", [
    ["runs"], ["audit"], ["audit", "--wide"], ["audit", "--summary"], ["audit", "--csv"], ["show", "1"], ["show", "2"],
    ["verify"],
])
def test_control_characters_from_the_journal_never_reach_the_terminal(hostile, argv):
    done = cli(argv[0], hostile, *argv[1:])
    assert done.returncode == 0, done.stderr
    assert_no_raw_control(done.stdout)
    assert_no_raw_control(done.stderr)
    if argv[0] in ("runs", "audit", "show"):
        assert b"\\x1b]0;pwned\\x07" in done.stdout  # the run key or reason is shown, visibly escaped


def test_error_lines_escape_journal_text_too(hostile):
    done = cli("show", hostile, "7", "--run", RUN)
    assert done.returncode == 1
    assert_no_raw_control(done.stderr)
    assert b"has no train call at step 7" in done.stderr


def test_json_output_stays_exact_json_of_the_same_text(hostile):
    listed = cli("audit", hostile, "--json")
    assert_no_raw_control(listed.stdout)  # the bidi override too: JSON would leave it raw
    rows = json.loads(listed.stdout)
    assert [r["run"] for r in rows] == [RUN, RUN] and rows[0]["reason"] == REASON
    shown = cli("show", hostile, "1", "--json")
    assert shown.returncode == 0, shown.stderr
    assert_no_raw_control(shown.stdout)  # JSON escapes them as \u001b
    tree = json.loads(shown.stdout)["structure"]
    items = {item["key"]: item["value"] for item in tree["items"]}
    assert items["lone"]["value"] == "a\udc80b" and "k\x1b[31m" in items


def test_show_renders_a_lone_surrogate_and_an_int_of_twenty_thousand_digits(hostile):
    done = cli("show", hostile, "1")
    assert done.returncode == 0, done.stderr
    out = done.stdout.decode("utf-8")
    assert "lone: str 'a\\udc80b'" in out
    assert "big: int of about 20001 digits" in out


def test_render_helpers_escape_controls_and_keep_json_exact():
    from stepjournal.adapters.cli._render import (  # private: a CLI helper under test
        clean, int_text, json_text, short_time,
    )

    assert clean("a\x1b[2Jb\x07\x9b\u202e\udc80") == "a\\x1b[2Jb\\x07\\x9b\\u202e\\udc80"
    assert clean("plain text, ünïcode ✓") == "plain text, ünïcode ✓"
    assert int_text(10 ** 20000) == "int of about 20001 digits" and int_text(-5) == "-5"
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # to read the number back in this process
    try:
        assert json.loads(json_text({"big": 10 ** 20000}))["big"] == 10 ** 20000
    finally:
        sys.set_int_max_str_digits(limit)
    assert sys.get_int_max_str_digits() == limit  # json_text restores the process's limit
    assert json.loads(json_text("a\udc80")) == "a\udc80" and json_text("é") == '"é"'
    assert json_text("a\u202eb\x9bc\x7f") == '"a\\u202eb\\u009bc\\u007f"'
    assert json.loads(json_text({"k\u2066": "a\u202eb\x9b"})) == {"k\u2066": "a\u202eb\x9b"}
    with pytest.raises(ValueError):
        json_text(float("nan"))
    assert short_time(1e300) == "?" and short_time(float("nan")) == "?" and short_time(None) == "-"


@pytest.mark.parametrize("extension", [".png", ".svg", ".html"])
def test_the_timeline_draws_and_prints_journal_text_escaped(hostile, tmp_path, extension):
    out = tmp_path / f"t{extension}"
    # Step 2 alone: its source (step 1) is hidden, so the run key is printed in the "sources" line.
    done = cli("timeline", hostile, "--steps", "2", "--run", RUN, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert_no_raw_control(done.stdout)
    assert_no_raw_control(done.stderr)  # no "Glyph 27 missing" warning from matplotlib either
    assert b"sources outside the view" in done.stdout and b"\\x1b]0;pwned\\x07" in done.stdout
    if extension != ".png":
        drawn = out.read_text(encoding="utf-8")
        assert "\x1b" not in drawn and "\x07" not in drawn and "\u202e" not in drawn
