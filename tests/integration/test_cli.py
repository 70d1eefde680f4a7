"""The `stepjournal` command line, run as a real subprocess on journals made by the demo and the engine."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from safetensors import safe_open

import attrs

from stepjournal import Journal, journaled
from stepjournal.payloads import register_codec
from stepjournal.tools import AUDIT_FIELDS
from stepjournal.policies import ReplayMissError

from lmdb_raw import flip_byte, items, put_raw
from cli_support import CLI, ok
from cli_support import run_cli as cli

SCRIPT = Path(sys.executable).with_name("stepjournal")


def cli_all(*commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Run several CLI commands, one after another (`run_cli`: each in a process of its own); in order."""
    return [cli(*c) for c in commands]


@attrs.frozen
class Point:
    """A custom payload type; its codec is registered in this process only, never in the CLI's."""

    x: float
    y: float


register_codec(Point, "tests.cli.Point", encode=lambda p: {"xy": torch.tensor([p.x, p.y])},
               decode=lambda v: Point(*v["xy"].tolist()))


def generate(prompts: torch.Tensor, step: int) -> dict:
    """A rollout with every kind of value an export must carry."""
    return {
        "ids": prompts + step,
        "logprobs": torch.linspace(-1, 0, 6, dtype=torch.bfloat16).reshape(2, 3),
        "phases": torch.full((2,), complex(step, -1), dtype=torch.complex128),
        "mask": np.array([[True, False, True]]),
        "big_endian": np.arange(3, dtype=">i4"),
        "words": np.array(["a", "bc"]),
        "pair": (step, "x"),
        "by_id": {7: "seven"},
        "blob": b"\x00\x01",
        "nan": float("nan"),
        "scale": np.float32(0.5),
        "uid": [f"s{step}-{i}" for i in range(2)],
        "point": Point(1.5, float(step)),
    }


def refuse(prompts: torch.Tensor, step: int) -> dict:
    raise AssertionError("must be replayed")


def make_engine_journal(path: str) -> None:
    """Through `journaled` and the policy engine, as the adapters' tests do: every action appears.

    Session 1 (run "adapters") dumps steps 1-4 and repeats into 5-6, and bypasses a validation call;
    session 2 replays steps 1-2 and is refused at step 9; run "other" dumps step 1.
    """
    prompts = torch.arange(6).reshape(2, 3)
    with Journal(path, run="adapters", fingerprint={"model": "tiny"}) as j:
        rollout = journaled(generate, j, "dump@1-4;repeat")
        validate = journaled(generate, j, "cache", mode_of=lambda *a, **k: "validate")
        for step in range(1, 7):
            rollout(prompts, step=step)
        validate(prompts, step=3)
    with Journal(path, run="adapters", fingerprint={"model": "tiny"}) as j:
        rollout = journaled(refuse, j, "replay")
        for step in (1, 2):
            rollout(prompts, step=step)
        with pytest.raises(ReplayMissError):
            rollout(prompts, step=9)
    with Journal(path, run="other") as j:
        journaled(generate, j, "dump")(prompts, step=1)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> str:
    """The journal `python -m stepjournal.adapters.demo` makes (run "demo": steps 1-6 recorded, 1-8 replayed)."""
    path = str(tmp_path_factory.mktemp("demo") / "journal")
    ok(subprocess.run([sys.executable, "-m", "stepjournal.adapters.demo", "--path", path],
                      capture_output=True, text=True, timeout=120))
    return path


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("engine") / "journal")
    make_engine_journal(path)
    return path


@pytest.fixture
def engine_copy(engine, tmp_path) -> str:
    """A private copy of the engine journal, to damage."""
    return shutil.copytree(engine, tmp_path / "copy", copy_function=shutil.copy2).as_posix()


def snapshot(path: str) -> dict:
    """Bytes and mtime of every file of a journal but lock.mdb (LMDB's shared reader table)."""
    return {
        name: (Path(path, name).read_bytes(), os.stat(os.path.join(path, name)).st_mtime_ns)
        for name in sorted(os.listdir(path))
        if name != "lock.mdb"
    }


# -- runs and audit --------------------------------------------------------------------------------------
def test_runs_lists_run_keys_sessions_fingerprints_and_counts(demo):
    as_json, as_table = cli_all(["runs", demo, "--json"], ["runs", demo])
    (run,) = json.loads(ok(as_json).stdout)
    assert run["run"] == "demo" and len(run["sessions"]) == 2
    assert run["counts"] == {"generated": 7, "replayed": 9, "bypassed": 0, "refused": 0}
    assert run["fingerprints"] == [{"model": "fake", "batch": 8}]
    table = ok(as_table).stdout
    assert "demo" in table and "model=fake" in table


def test_audit_json_is_one_object_per_call_with_the_documented_keys(demo):
    rows = json.loads(ok(cli("audit", demo, "--json")).stdout)
    assert len(rows) == 16
    required = {"schema_version", "run", "step", "gen_index", "action", "source_step", "policy", "digest", "ts"}
    assert all(required <= row.keys() and row["schema_version"] == 1 for row in rows)
    step7 = [r for r in rows if r["step"] == 7]
    assert [(r["action"], r["source_step"], r["policy"]) for r in step7] == [("replayed", 1, "repeat")]
    assert [r["gen_index"] for r in rows if r["step"] == 4] == [0, 1, 0, 1]


def test_audit_table_shows_every_action_policy_and_source(engine):
    out = ok(cli("audit", engine)).stdout
    for word in ("generated", "replayed", "bypassed", "refused", "dump@1-4", "repeat", "1#0"):
        assert word in out


def test_audit_csv_has_a_header_and_one_row_per_call(engine):
    rows = list(csv.DictReader(io.StringIO(ok(cli("audit", engine, "--csv")).stdout)))
    assert len(rows) == 11 and list(rows[0]) == list(AUDIT_FIELDS)
    refused = [r for r in rows if r["action"] == "refused"]
    assert [(r["step"], r["policy"], r["stored"], r["digest"]) for r in refused] == [("9", "replay", "false", "")]


def test_audit_filters_by_run_steps_and_action(engine):
    rows = json.loads(ok(cli("audit", engine, "--run", "adapters", "--steps", "2-5", "--action", "replayed",
                             "--json")).stdout)
    assert [(r["step"], r["source_step"]) for r in rows] == [(5, 1), (2, 2)]


def test_installed_console_script_runs_the_same_cli(demo):
    result = subprocess.run([str(SCRIPT), "audit", demo, "--json", "--steps", "8"], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert [(r["step"], r["source_step"]) for r in json.loads(result.stdout)] == [(8, 2)]


# -- show ------------------------------------------------------------------------------------------------
def test_show_prints_keys_dtypes_shapes_and_first_values(demo):
    out = ok(cli("show", demo, "4", "--index", "1")).stdout
    assert "step 4" in out and "generated" in out
    assert "responses" in out and "torch.int64" in out and "[8, 32]" in out
    with Journal(demo, readonly=True) as j:
        first = j.load_output(j.lookup(4, 1, run="demo"))["responses"].flatten()[:3].tolist()
    assert ", ".join(map(str, first)) in out


def test_show_json_of_a_replayed_step_names_its_source(demo):
    shown = json.loads(ok(cli("show", demo, "7", "--json")).stdout)
    assert shown["call"]["action"] == "replayed" and shown["call"]["source_step"] == 1
    keys = {item["key"]: item["value"] for item in shown["structure"]["items"]}
    assert keys["old_log_probs"]["dtype"] == "torch.float32" and keys["old_log_probs"]["shape"] == [8, 32]
    assert len(keys["old_log_probs"]["preview"]) == 6


def test_show_lists_a_custom_type_as_its_codec_stored_it_without_the_codec(engine):
    out = ok(cli("show", engine, "3", "--run", "adapters")).stdout
    assert "custom tests.cli.Point" in out and "xy: tensor torch.float32 [2]" in out and "1.5, 3.0" in out


def test_show_needs_run_when_the_journal_has_several(engine):
    result = cli("show", engine, "1")
    assert result.returncode == 1 and "choose one with --run" in result.stderr


# -- verify ----------------------------------------------------------------------------------------------
def test_verify_passes_a_whole_journal(demo):
    result = ok(cli("verify", demo))
    assert "whole" in result.stdout


def test_verify_catches_a_payload_byte_flipped_in_lmdb_and_names_the_step(engine_copy):
    with Journal(engine_copy, readonly=True) as j:
        digest = j.lookup(3, run="adapters").event.output.digest
    flip_byte(engine_copy, "payloads", key=bytes.fromhex(digest))
    result = cli("verify", engine_copy)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "payload" in result.stdout and digest[:16] in result.stdout
    assert "journal is damaged; affected steps: 3\n" in result.stdout
    assert result.stdout.startswith(f"1 problem in {engine_copy}\n")  # its own line: a long path stays whole


def test_verify_catches_an_event_with_a_broken_body_and_names_the_step(engine_copy):
    with Journal(engine_copy, readonly=True) as j:
        seq = j.lookup(2, run="adapters").seq
    key = seq.to_bytes(8, "big")
    body = msgpack.unpackb(dict(items(engine_copy, "events"))[key])
    body["policy"] = 5  # a number where the schema says string
    put_raw(engine_copy, "events", key, msgpack.packb(body))
    result = cli("verify", engine_copy, "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    (event_problem,) = [p for p in report["problems"] if p["kind"] == "event"]
    assert event_problem["where"] == f"#{seq}" and event_problem["steps"] == [2]
    assert "broken body" in event_problem["detail"] and 2 in report["affected_steps"]


def test_audit_of_a_damaged_journal_fails_in_one_line_and_points_at_verify(engine_copy):
    put_raw(engine_copy, "events", (3).to_bytes(8, "big"), b"\xc1 not msgpack")
    result = cli("audit", engine_copy)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.count("\n") == 1 and "stepjournal verify" in result.stderr


# -- read-only -------------------------------------------------------------------------------------------
def read_only_commands(path: str, scratch: Path) -> list[list[str]]:
    """Every read-only command once (output formats share the reading code)."""
    return [
        ["runs", path],
        ["audit", path, "--json"],
        ["show", path, "1", "--run", "adapters"],
        ["verify", path],
        ["export", path, "--run", "adapters", "--to", str(scratch / "export")],
        ["timeline", path, "--out", str(scratch / "timeline.png")],
    ]


def test_read_only_commands_leave_the_journal_byte_identical(engine_copy, tmp_path):
    before = snapshot(engine_copy)
    for result in cli_all(*read_only_commands(engine_copy, tmp_path)):
        ok(result)
    assert snapshot(engine_copy) == before


def on_read_only_mount(folder: str, *commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Run commands (at once) where `folder` is read-only: by its permissions, or (as root, who ignores
    them) on a read-only bind mount in a private mount namespace."""
    if os.geteuid() == 0:
        q = shlex.quote(folder)
        script = f"mount --bind {q} {q} && mount -o remount,bind,ro {q} && exec \"$@\""
        commands = tuple(["unshare", "-m", "sh", "-c", script, "sh", *c] for c in commands)
    procs = [subprocess.Popen(c, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands]
    done = []
    for command, proc in zip(commands, procs):
        out, err = proc.communicate(timeout=120)
        done.append(subprocess.CompletedProcess(command, proc.returncode, out, err))
    return done


def test_read_only_commands_work_on_a_copy_in_a_read_only_place(engine, tmp_path):
    folder = shutil.copytree(engine, tmp_path / "ro" / "journal").as_posix()
    if os.geteuid() != 0:
        for name in os.listdir(folder):
            os.chmod(os.path.join(folder, name), 0o444)
        os.chmod(folder, 0o555)
    commands = [["audit", folder, "--json"], ["show", folder, "1", "--run", "adapters"], ["verify", folder]]
    probe, *results = on_read_only_mount(
        folder,
        ["touch", os.path.join(folder, "probe")],
        *([*CLI, *c] for c in commands),
    )
    assert probe.returncode != 0, "the copy is not read-only; the test would prove nothing"
    for result in results:
        ok(result)
    assert sorted(os.listdir(folder)) == sorted(os.listdir(engine))


_PYTHON_WORDS = re.compile(r"\b\w+=\S|\b[A-Za-z_]\w*\((?!e?s\))")  # keep_last=2, Journal('x'); not process(es)


def test_errors_speak_the_command_lines_words_not_pythons(engine_copy, tmp_path):
    """Library messages written for a Python caller (Journal('x'), readonly=True, run_a) reach the
    command line in its own words: a folder, a reading command, --run-a."""
    remote = (tmp_path / "remote").as_uri()
    ok(cli("push", engine_copy, remote))
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("not a journal")
    two_runs = str(tmp_path / "two-runs")
    for run in ("a", "b"):
        with Journal(two_runs, run=run) as journal:
            journal.record(1, {"x": torch.zeros(1)})
    read_only = shutil.copytree(engine_copy, tmp_path / "ro").as_posix()
    failed = [cli("pull", remote, str(occupied)), cli("diff", two_runs, two_runs),
              *on_read_only_mount(read_only, [*CLI, "reindex", read_only])]
    # As root the mount is read-only (EROFS); otherwise the folder's permissions refuse (EACCES).
    refused = "with a command that only reads (runs, audit" if os.geteuid() == 0 else "permission denied"
    expected = (f"e.g. {occupied / 'stepjournal'}", "choose one with --run-a", refused)
    for done, words in zip(failed, expected):
        assert done.returncode != 0 and words in done.stderr, done.stderr
        assert not _PYTHON_WORDS.search(done.stderr), done.stderr


WRITER = """
import os, sys, time, torch
from stepjournal import Journal
path, stop = sys.argv[1], sys.argv[2]
with Journal(path, run="live") as j:
    step = 0
    while not os.path.exists(stop) and step < 20000:
        step += 1
        j.record(step, {"ids": torch.full((64, 64), step)})
        if step == 1:
            print("ready", flush=True)
        time.sleep(0.002)
print(step, flush=True)
"""


def test_read_only_commands_work_while_a_trainer_writes(tmp_path):
    path, stop = str(tmp_path / "live"), str(tmp_path / "stop")
    writer = subprocess.Popen([sys.executable, "-c", WRITER, path, stop], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        rows = json.loads(ok(cli("audit", path, "--json")).stdout)
        ok(cli("verify", path))
        with Journal(path, readonly=True) as j:
            grown = j.last_seq()
    finally:
        Path(stop).touch()
        out, _ = writer.communicate(timeout=60)
    assert writer.returncode == 0
    # the writer kept appending while the commands ran (event 1 is its session)
    assert 0 < len(rows) < grown - 1 <= int(out.split()[-1])
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))  # a consistent snapshot


# -- export ----------------------------------------------------------------------------------------------
def test_export_writes_safetensors_and_json_that_other_tools_read(engine, tmp_path):
    target = tmp_path / "out"
    ok(cli("export", engine, "--run", "adapters", "--steps", "1-2", "--to", str(target)))
    manifest = json.loads((target / "manifest.json").read_text())
    assert manifest["format"] == "stepjournal-export" and manifest["format_version"] == 1
    assert [(e["step"], e["gen_index"], e["dir"]) for e in manifest["entries"]] == [
        (1, 0, "step_000001_idx_0"), (2, 0, "step_000002_idx_0")]
    folder = target / "step_000002_idx_0"
    with Journal(engine, readonly=True) as j:
        original = j.load_output(j.lookup(2, run="adapters"))
    with safe_open(str(folder / "tensors.safetensors"), framework="pt") as f:
        assert set(f.keys()) == {"ids", "logprobs", "mask", "point.xy"}
        assert torch.equal(f.get_tensor("ids"), original["ids"])
        assert f.get_tensor("logprobs").dtype == torch.bfloat16
        assert torch.equal(f.get_tensor("logprobs"), original["logprobs"])
        assert f.get_tensor("mask").numpy().tolist() == [[True, False, True]]
        assert f.get_tensor("point.xy").tolist() == [1.5, 2.0]
    rest = json.loads((folder / "rest.json").read_text())["value"]
    assert rest["ids"] == {"$tensor": "ids", "kind": "torch", "dtype": "torch.int64", "shape": [2, 3],
                           "file": "tensors.safetensors"}
    assert rest["pair"] == {"$tuple": [2, "x"]} and rest["by_id"] == {"$dict": [[7, "seven"]]}
    assert rest["blob"] == {"$bytes": "AAE="} and rest["nan"] == {"$float": "nan"}
    assert rest["scale"] == {"$numpy_scalar": "<f4", "value": 0.5} and rest["uid"] == ["s2-0", "s2-1"]
    # a custom type, exported as its codec stored it, without the codec in the CLI's process
    assert rest["point"]["$custom"] == "tests.cli.Point" and rest["point"]["value"]["xy"]["$tensor"] == "point.xy"
    # dtypes safetensors lacks are raw C-order bytes beside the JSON, described by it
    phases = rest["phases"]
    start, stop = phases["offset"], phases["offset"] + phases["nbytes"]
    data = np.frombuffer((folder / phases["file"]).read_bytes()[start:stop], dtype=np.complex128).reshape(phases["shape"])
    assert np.array_equal(data, original["phases"].numpy())
    for name in ("big_endian", "words"):
        node = rest[name]
        start, stop = node["offset"], node["offset"] + node["nbytes"]
        raw = np.frombuffer((folder / node["file"]).read_bytes()[start:stop], dtype=np.dtype(node["dtype"]))
        assert np.array_equal(raw.reshape(node["shape"]), original[name])


def test_export_refuses_a_folder_that_is_not_empty(engine, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    result = cli("export", engine, "--run", "adapters", "--to", str(tmp_path / "full"))
    assert result.returncode == 1 and "not an empty folder" in result.stderr
    assert os.listdir(tmp_path / "full") == ["keep.txt"]


# -- reindex ---------------------------------------------------------------------------------------------
def test_reindex_rebuilds_a_damaged_index_and_opens_no_session(engine_copy):
    key, seq = items(engine_copy, "gen")[0]
    put_raw(engine_copy, "gen", key, (int.from_bytes(seq, "big") + 1).to_bytes(8, "big"))
    with Journal(engine_copy, readonly=True) as j:
        assert [p.kind for p in j.verify()] == ["index"]
    events_before = items(engine_copy, "events")
    ok(cli("reindex", engine_copy))
    with Journal(engine_copy, readonly=True) as j:
        assert j.verify() == []
    assert items(engine_copy, "events") == events_before  # no session, no event: only the index changed


# -- errors ----------------------------------------------------------------------------------------------
def one_line_error(result: subprocess.CompletedProcess, status: int) -> str:
    assert result.returncode == status, result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1
    assert result.stderr.startswith("stepjournal: error: ")
    return result.stderr


def test_a_missing_journal_is_a_one_line_error(tmp_path):
    results = cli_all(["audit", str(tmp_path / "nowhere")], ["reindex", str(tmp_path / "nowhere")])
    for result in results:
        assert "no journal at" in one_line_error(result, 1)
    assert not (tmp_path / "nowhere").exists()


def test_bad_arguments_are_one_line_usage_errors(demo, tmp_path):
    steps, index, extension = cli_all(
        ["audit", demo, "--steps", "3-x"],
        ["show", demo, "1", "--index", "-1"],
        ["timeline", demo, "--out", str(tmp_path / "t.gif")],
    )
    assert "--steps" in one_line_error(steps, 2) and "position" in steps.stderr
    assert "negative" in one_line_error(index, 2)
    assert ".png" in one_line_error(extension, 2)


# -- docs ------------------------------------------------------------------------------------------------
def test_docs_cover_every_command_and_every_json_key():
    from stepjournal.adapters.cli._app import build_parser  # private: a CLI helper under test

    doc = (Path(__file__).resolve().parents[2] / "docs" / "audit.md").read_text()
    (commands,) = [a for a in build_parser()._actions if a.dest == "command"]
    for name in commands.choices:
        assert f"## `{name}`" in doc, name
    schema = doc[doc.index("### `audit --json`"):doc.index("### `runs --json`")]
    for key in AUDIT_FIELDS:
        assert f"| `{key}` |" in schema, key


# -- the package shape: --help is light, export is a journal API ----------------------------------------
def test_help_imports_no_verb_and_no_table_tensor_or_plotting_code_beyond_the_journal():
    """Only what `import stepjournal` itself loads may be loaded by `stepjournal --help`."""
    code = (
        "import sys\n"
        "import stepjournal.base._log  # the package and its logging (structlog, which imports rich.table)\n"
        "before = set(sys.modules)\n"
        "from stepjournal.adapters.cli import main\n"
        "assert main(['--help']) == 0\n"
        "new = set(sys.modules) - before\n"
        "heavy = ('torch', 'numpy', 'matplotlib', 'safetensors', 'verl', 'trl', 'rich.table', 'rich.progress',\n"
        "         'rich.tree')\n"
        "loaded = sorted(m for m in new if m in heavy or m.split('.')[0] in heavy[:6])\n"
        "verbs = sorted(m for m in new if m.startswith('stepjournal.adapters.cli.') and m.split('.')[-1] not in\n"
        "               ('_app', '_render', '_args', '_examples'))\n"  # _args: shared argument types; _examples: help

        "assert not loaded and not verbs, (loaded, verbs)\n"
        "print('torch' in before)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # The journal's payload codec imports torch today (journal/payloads/_codec.py), so `import stepjournal` does.
    assert result.stdout.split()[-1] in ("True", "False")


def test_export_payloads_is_the_python_api_of_the_export_verb(engine, tmp_path):
    from stepjournal.tools import EXPORT_FORMAT_VERSION, OpaqueReader, OpaqueValue, export_payloads
    from stepjournal.errors import ExportError
    from stepjournal.policies import StepRanges

    seen = []
    manifest = export_payloads(engine, str(tmp_path / "out"), run="adapters", steps=StepRanges.parse("2-3"),
                               inputs=True, progress=lambda done, total: seen.append((done, total)))
    assert manifest["format_version"] == EXPORT_FORMAT_VERSION and manifest["steps"] == "2-3"
    assert [(e["step"], e["gen_index"]) for e in manifest["entries"]] == [(2, 0), (3, 0)]
    assert seen == [(1, 2), (2, 2)]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text()) == manifest
    with safe_open(str(tmp_path / "out" / "step_000002_idx_0" / "tensors.safetensors"), "pt") as st:
        assert torch.equal(st.get_tensor("ids"), torch.arange(6).reshape(2, 3) + 2)
    # The reader needs no codec: the custom Point comes back as what its codec stored.
    with OpaqueReader(engine) as reader:
        event = reader.journal.lookup(2, 0, mode="train", run="adapters").event
        point = reader.load(event.output, 2)["point"]
    assert isinstance(point, OpaqueValue) and point.name == "tests.cli.Point"
    assert point.value["xy"].tolist() == [1.5, 2.0]
    with pytest.raises(ExportError, match="several runs"):
        export_payloads(engine, str(tmp_path / "again"))
    with pytest.raises(ExportError, match="not an empty folder"):
        export_payloads(engine, str(tmp_path / "out"), run="adapters")


def test_export_without_safetensors_names_the_extra(engine, tmp_path):
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'safetensors':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from stepjournal.tools import export_payloads\n"
        "try:\n"
        f"    export_payloads({engine!r}, {str(tmp_path / 'out')!r}, run='adapters')\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "from stepjournal.adapters.cli import main\n"
        f"sys.exit(main(['export', {engine!r}, '--run', 'adapters', '--to', {str(tmp_path / 'out2')!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "pip install 'safetensors>=0.4'" in result.stdout
    assert "stepjournal: error: export needs safetensors: pip install 'safetensors>=0.4'" in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "out2").exists()


# Each verb's error paths: one line on stderr, in the command line's words (no `name=value`, no `call(`).
ERROR_PATHS = [
    ["runs", "{T}/missing"], ["audit", "{J}", "--steps", "5-2"], ["audit", "{J}", "--run", "nope"],
    ["show", "{J}", "99", "--run", "adapters"], ["show", "{J}", "1", "--run", "nope"],
    ["show", "{J}", "1", "--run", "adapters", "--text", "--tokenizer", "{T}/nowhere"], ["verify", "{T}/missing"],
    ["export", "{J}", "--to", "{T}/out", "--steps", "x"], ["export", "{J}", "--to", "{T}/out", "--run", "nope"],
    ["timeline", "{J}", "--out", "{T}/t.gif"], ["prune", "{J}", "--keep-last", "0", "--dry-run"],
    ["prune", "{J}", "--max-bytes", "lots"],
    ["compact", "{T}/missing"], ["reindex", "{T}/missing"],
    ["import-verl", "{T}/nothing", "--into", "{T}/j2", "--trust-pickle"], ["push", "{J}"],
    ["pull", "nowhere", "{T}/j3"], ["clone", "{T}/no-remote", "{T}/j4"], ["status", "{J}", "nope"],
    ["remote", "add", "{J}", "bad name!", "s3://b/x"], ["remote", "remove", "{J}", "nope"],
    ["diff", "{J}", "{T}/missing"], ["report", "{J}", "-o", "{T}/r.txt"],
    ["report", "{J}", "-o", "{T}/r.html", "--run", "nope"], ["import", "{T}/missing.bundle", "{T}/j5"],
    ["completion", "fish"], ["audit", "{J}", "-n", "-1"],
]


@pytest.mark.parametrize("argv", ERROR_PATHS, ids=[" ".join(a[:2]) + f" #{i}" for i, a in enumerate(ERROR_PATHS)])
def test_every_verbs_error_paths_say_one_line_in_the_command_lines_words(engine, tmp_path, argv):
    (tmp_path / "nothing").mkdir()
    done = cli(*[a.format(J=engine, T=tmp_path) for a in argv])
    assert done.returncode in (1, 2), (argv, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepjournal: error: "), done.stderr
    assert not _PYTHON_WORDS.search(lines[0].replace(str(tmp_path), "T").replace(engine, "J")), lines[0]
