"""``stepjournal audit --json`` as typed in a shell: the rows each append kept print what the log gives, a
changed row is named by ``verify`` and mended by ``reindex``, and a planted control character is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmdb_raw import items, put_raw
from stepjournal import Journal
from stepjournal.upkeep import Retention, prune

BIN = Path(sys.executable).parent


def shell(line: str, cwd: Path) -> subprocess.CompletedProcess:
    """`line` through bash, the venv's ``stepjournal`` first on PATH, as a user types it."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def journal(tmp_path) -> Path:
    """One run: records, a replay, a bypass, a refusal, a stage, and retention's releases."""
    path = tmp_path / "j"
    with Journal(str(path), run="exp", sync=False) as j:
        for step in range(1, 6):
            j.record(step, b"x" * step, policy="cache", reason="miss", duration_s=0.25)
            j.record(step, b"r", stage="reward")
        j.record_replay(6, j.lookup(2), policy="repeat", reason="6 -> 2")
        j.record_bypass(6, reason="validation \x1b[31m red")
        j.record_refusal(7, reason="replay miss")
        prune(j, Retention(keep_last=2))
    return path


def test_every_row_from_the_appends_prints_as_the_log_gives_it_and_verify_then_reindex_mend_a_changed_row(
        journal, tmp_path):
    # `--run exp` reads the log (a filter); this journal has that one run, so both print every row
    same = "stepjournal audit j --json > rows.json && stepjournal audit j --json --run exp > log.json && cmp rows.json log.json"
    done = shell(same, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads((tmp_path / "rows.json").read_text())
    with Journal(str(journal), readonly=True) as j:
        assert len(rows) == len(j.audit())
    assert {r["action"] for r in rows} == {"generated", "replayed", "bypassed", "refused",
                                                               "released"}
    assert any(r["released_by"] for r in rows) and "\x1b" not in (tmp_path / "rows.json").read_text()

    key, text = items(str(journal), "rows")[0]
    put_raw(str(journal), "rows", key, text.replace(b'"reason":"miss"', b'"reason": "hit"'))
    assert shell(same, tmp_path).returncode != 0  # the verb prints what is stored: hence `verify`
    checked = shell("stepjournal verify j", tmp_path)
    assert checked.returncode == 1 and "rows" in checked.stdout and "stepjournal reindex" in checked.stdout
    mended = shell(f"stepjournal reindex j && stepjournal verify j && {same}", tmp_path)
    assert mended.returncode == 0, mended.stdout + mended.stderr


def test_a_row_holding_a_character_a_terminal_acts_on_is_refused_naming_verify_and_reindex(journal, tmp_path):
    key, text = items(str(journal), "rows")[0]
    put_raw(str(journal), "rows", key, text.replace(b'"reason":"miss"', b'"reason": "\x1b]0;owned\x07"'))
    done = shell("stepjournal audit j --json", tmp_path)
    assert done.returncode == 1 and "\x1b" not in done.stdout + done.stderr
    seq = int.from_bytes(key, "big")
    assert f"audit row #{seq}" in done.stderr and "stepjournal verify" in done.stderr
    assert "stepjournal reindex" in done.stderr
    assert shell("stepjournal reindex j && stepjournal audit j --json > /dev/null", tmp_path).returncode == 0
