"""A call's fields are declared once, in its event class: a field added there alone reaches every reader.

The package is copied and one line is added to `GenerationRecorded` in the copy's `_events.py`, as a
developer would add a field; a fresh process running the copy records calls, and the new field shows in
the audit row (`AuditRecord`), in the fast decoder's row (msgspec), in the map reader's row and in
``stepjournal audit --json`` run as a command, from the rows each append kept and from the log. A reader
that listed the fields by hand would not show it. The same run of the unchanged copy shows no such key,
so the checks can fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANCHOR = "    stage: str = event_field(STAGE, default=DEFAULT_STAGE, audit=True)\n"
NEW_FIELD = '    sampler: Optional[str] = event_field(TEXT, default="top-p 0.9", optional=True, audit=True)\n'

# Runs in the copy: records two calls, then prints what each reader makes of the first one.
_READERS = r"""
import json, sys
import msgpack
from stepjournal import Journal
from stepjournal.events._convert import checked_body, decode_event
from stepjournal.index._audit import AUDIT_FIELDS, AuditRecord
from stepjournal.index._call_rows import KeyRuleCache, call_row
from stepjournal.index._native_rows import row_of

with Journal(sys.argv[1], run="exp", sync=False) as journal:
    journal.record(1, b"one", policy="cache", reason="miss")
    journal.record(2, b"two", policy="cache", reason="miss")
with Journal(sys.argv[1], readonly=True) as journal:
    seq, raw = [(seq, bytes(raw)) for seq, raw in journal.raw_events()][1]
print(json.dumps({
    "stored_keys": sorted(msgpack.unpackb(raw)),
    "audit_fields": list(AUDIT_FIELDS),
    "record": AuditRecord.from_event(seq, decode_event(raw)).to_json(),
    "native": row_of(seq, raw, KeyRuleCache(), plain=True),
    "map": call_row(seq, *checked_body(raw), KeyRuleCache()),
}))
"""


def _copy_package(tmp_path: Path, *, new_field: bool) -> Path:
    """The package as installed (`stepjournal`, its adapters and policies) under `tmp_path`, its first call
    event class given one more field when `new_field`."""
    top = tmp_path / "site"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "journal", top / "stepjournal", ignore=ignore)
    shutil.copytree(ROOT / "adapters", top / "stepjournal" / "adapters", ignore=ignore)
    shutil.copytree(ROOT / "policies", top / "stepjournal" / "policies", ignore=ignore)
    if new_field:
        events = top / "stepjournal" / "events" / "_events.py"
        source = events.read_text(encoding="utf-8")
        at = source.index(ANCHOR, source.index("class GenerationRecorded(")) + len(ANCHOR)
        events.write_text(source[:at] + NEW_FIELD + source[at:], encoding="utf-8")
    return top


def _run(top: Path, *args: str, cwd: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(top)}  # the copy before the installed package
    done = subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _readers(tmp_path: Path, *, new_field: bool) -> dict:
    top = _copy_package(tmp_path, new_field=new_field)
    journal = tmp_path / "j"
    script = tmp_path / "readers.py"
    script.write_text(_READERS, encoding="utf-8")
    out = json.loads(_run(top, "-P", str(script), str(journal), cwd=tmp_path))
    located = _run(top, "-P", "-c", "import stepjournal; print(stepjournal.__file__)", cwd=tmp_path)
    assert located.strip() == str(top / "stepjournal" / "__init__.py")  # the copy ran, not the installed package
    # The verb as typed: every row (the rows each append kept), and filtered (rows read from the log).
    out["cli"] = json.loads(_run(top, "-P", "-m", "stepjournal", "audit", "--json", str(journal), cwd=tmp_path))
    out["cli_log"] = json.loads(_run(top, "-P", "-m", "stepjournal", "audit", "--json", "--run", "exp",
                                     str(journal), cwd=tmp_path))
    return out


def test_a_field_added_to_a_call_event_class_reaches_the_audit_row_the_fast_decoder_and_audit_json(tmp_path):
    out = _readers(tmp_path, new_field=True)
    assert "sampler" in out["stored_keys"]  # recorded into the event's bytes
    assert out["audit_fields"][-1] == "sampler"  # an unplaced column comes last: the layout keeps its order
    for reader in ("record", "native", "map"):
        assert out[reader] is not None, f"{reader} did not read the call"
        assert out[reader]["sampler"] == "top-p 0.9", reader
        assert list(out[reader]) == out["audit_fields"], reader
    assert out["native"] == out["record"] == out["map"]
    for verb in ("cli", "cli_log"):
        assert [row["sampler"] for row in out[verb]] == ["top-p 0.9"] * 2, verb
        assert [list(row) for row in out[verb]] == [out["audit_fields"]] * 2, verb


def test_the_unchanged_copy_shows_no_such_field(tmp_path):
    """The control: the copy as it is, through the same readers, has no ``sampler`` anywhere."""
    out = _readers(tmp_path, new_field=False)
    assert "sampler" not in out["stored_keys"] and "sampler" not in out["audit_fields"]
    for reader in ("record", "native", "map"):
        assert out[reader] is not None and "sampler" not in out[reader], reader
    assert all("sampler" not in row for verb in ("cli", "cli_log") for row in out[verb])


def test_the_anchor_line_is_in_the_first_call_event_class():
    """The line the field is added after is still where the test expects it (else the test adds nothing)."""
    source = (ROOT / "journal" / "events" / "_events.py").read_text(encoding="utf-8")
    start = source.index("class GenerationRecorded(")
    assert start < source.index(ANCHOR, start) < source.index("class ReplayServed(")
