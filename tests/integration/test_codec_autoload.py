"""Codec plugins: a type the project ships a codec for is stored and read in processes that never
imported its adapter; a type nobody registered still warns; a broken plugin is named, never silent.

Each behaviour runs in a fresh interpreter (the test process has imported the adapters long ago),
against a real LMDB journal and real verl `DataProto`s.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

from stepjournal.payloads import CodecRegistry

pytest.importorskip("verl.protocol")

ROOT = Path(__file__).resolve().parents[2]

# Shared by the scripts: deterministic DataProtos (bf16 with NaN payloads, ints, bools, object arrays
# of mixed Python values, meta_info), and the library's warnings collected as event dicts.
PRELUDE = """
import json, logging, sys
import numpy as np, torch
from tensordict import TensorDict
from verl.protocol import DataProto

class Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.events = []
    def emit(self, record):
        self.events.append(dict(getattr(record, "stepjournal", {"event": record.getMessage()})))

warnings = Collect()
logging.getLogger("stepjournal").addHandler(warnings)

def make(step):
    g = torch.Generator().manual_seed(step)
    logp = torch.randn(2, 5, generator=g).to(torch.bfloat16)
    logp.view(torch.int16)[0, 0] = 0x7FC1                      # a NaN with a payload
    batch = TensorDict({"responses": torch.randint(0, 1000, (2, 5), generator=g),
                        "logp": logp, "mask": torch.rand(2, 5, generator=g) > 0.5}, batch_size=[2])
    rows = np.empty(2, dtype=object)
    rows[0], rows[1] = {"answer": "4", "score": 1.5}, ["tool", step, None]
    return DataProto(batch=batch,
                     non_tensor_batch={"uid": np.array([f"u{step}a", f"u{step}b"], dtype=object),
                                       "extra": rows, "lens": np.array([5, 3], dtype=np.int32)},
                     meta_info={"global_steps": step, "temperature": 0.7})
"""


def run(tmp_path: Path, body: str, *, extra_path: Path | None = None) -> dict:
    """Run PRELUDE + `body` in a new interpreter; return the JSON its last stdout line holds."""
    code = PRELUDE + textwrap.dedent(body)
    if extra_path is not None:
        code = f"import sys; sys.path.insert(0, {str(extra_path)!r})\n" + code
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:] + result.stdout[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_dataprotos_are_recorded_and_replayed_bit_identical_by_processes_that_import_only_stepjournal(tmp_path):
    path = str(tmp_path / "journal")
    recorded = run(tmp_path, f"""
        import stepjournal.errors
        import stepjournal.payloads
        assert "stepjournal.adapters.verl" not in sys.modules
        with stepjournal.Journal({path!r}) as journal:
            rollout = stepjournal.journaled(make, journal, "cache")
            first = "stepjournal.adapters.verl" in sys.modules
            for step in (1, 2, 3):
                rollout(step=step)
                assert rollout.last_outcome.action == "generated"
            steps = journal.recorded_steps()
        print(json.dumps({{"before_first_call": first, "after": "stepjournal.adapters.verl" in sys.modules,
                          "steps": steps, "warnings": warnings.events}}))
    """)
    assert recorded["before_first_call"] is False and recorded["after"] is True
    assert recorded["warnings"] == [] and recorded["steps"] == [1, 2, 3]

    replayed = run(tmp_path, f"""
        import stepjournal.errors
        import stepjournal.payloads
        assert "stepjournal.adapters.verl" not in sys.modules
        def must_not_run(step):
            raise AssertionError("replay generated")
        with stepjournal.Journal({path!r}) as journal:
            rollout = stepjournal.journaled(must_not_run, journal, "replay")
            served = {{}}
            for step in (1, 2, 3):
                served[step] = rollout(step=step)
                assert rollout.last_outcome.action == "replayed"
        from stepjournal.adapters.verl import dataproto_diff    # only to compare, after the replay
        diffs = {{step: dataproto_diff(value, make(step)) for step, value in served.items()}}
        print(json.dumps({{"types": [type(v).__name__ for v in served.values()], "diffs": diffs,
                          "nan_bits": int(served[1].batch["logp"].view(torch.int16)[0, 0]),
                          "warnings": warnings.events}}))
    """)
    assert replayed["types"] == ["DataProto"] * 3
    assert replayed["diffs"] == {"1": [], "2": [], "3": []}
    assert replayed["nan_bits"] == 0x7FC1 and replayed["warnings"] == []


def test_a_subclass_loads_its_bases_codec_plugin_and_is_refused_naming_that_codec(tmp_path):
    # A subclass is not stored as its base (it would come back as a DataProto); the message says so.
    out = run(tmp_path, """
        import stepjournal.errors
        import stepjournal.payloads
        class MyBatch(DataProto):
            pass
        try:
            stepjournal.payloads.encode_payload(MyBatch(batch=make(1).batch))
        except stepjournal.errors.UnsupportedValueError as exc:
            message = str(exc)
        print(json.dumps({"message": message, "loaded": "stepjournal.adapters.verl" in sys.modules}))
    """)
    assert out["loaded"] is True
    assert "its base class verl.protocol.DataProto has the codec 'verl.DataProto'" in out["message"]
    assert "register a codec" in out["message"]


def test_a_registry_without_autoload_loads_no_plugin(tmp_path):
    out = run(tmp_path, """
        import stepjournal.errors
        import stepjournal.payloads
        registry = stepjournal.payloads.CodecRegistry(autoload=False)
        try:
            stepjournal.payloads.encode_payload(make(1), registry=registry)
            refused = False
        except stepjournal.errors.UnsupportedValueError as exc:
            refused = "cannot store verl.protocol.DataProto" in str(exc)
        print(json.dumps({"refused": refused, "loaded": "stepjournal.adapters.verl" in sys.modules}))
    """)
    assert out == {"refused": True, "loaded": False}


def test_a_type_nobody_registered_still_warns_output_not_stored(tmp_path):
    path = str(tmp_path / "journal")
    out = run(tmp_path, f"""
        import stepjournal.errors
        import stepjournal.payloads
        class Sample:
            pass
        with stepjournal.Journal({path!r}) as journal:
            rollout = stepjournal.journaled(lambda step: Sample(), journal, "cache")
            rollout(step=1)
            rollout(step=2)
            steps = journal.recorded_steps()
        print(json.dumps({{"steps": steps, "warnings": warnings.events}}))
    """)
    assert out["steps"] == []
    warned = [e for e in out["warnings"] if e["event"] == "output_not_stored"]
    assert [e["step"] for e in warned] == [1, 2]
    assert "cannot store __main__.Sample" in warned[0]["error"] and "register a codec" in warned[0]["error"]
    assert not [e for e in out["warnings"] if e["event"] == "codec_plugin_failed"]


def _install_broken_plugins(site: Path) -> None:
    """A distribution `brokenplug` whose codec plugins are broken: one names a module that does not
    exist, one a function that registers nothing. Its data type lives in an importable module."""
    (site / "brokenplug.py").write_text(
        "class Thing:\n    pass\n\nclass Other:\n    pass\n\ndef register(registry):\n    pass\n"
    )
    info = site / "brokenplug-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brokenplug\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[stepjournal.codecs]\n"
        "brokenplug.Thing = brokenplug_codecs_missing:register\n"
        "brokenplug.Other = brokenplug:register\n"
        "\n[stepjournal.codec_names]\n"
        "brokenplug.Thing = brokenplug_codecs_missing:register\n"
    )


def test_a_broken_codec_plugin_is_named_on_record_and_on_load_every_time(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    _install_broken_plugins(site)
    path = str(tmp_path / "journal")
    out = run(tmp_path, f"""
        import stepjournal.errors
        import stepjournal.payloads
        from brokenplug import Other, Thing
        with stepjournal.Journal({path!r}) as journal:
            rollout = stepjournal.journaled(lambda step: Thing(), journal, "cache")
            rollout(step=1)
            rollout(step=2)
        errors = []
        for value in (Thing(), Thing(), Other()):
            try:
                stepjournal.payloads.encode_payload(value)
            except stepjournal.errors.CodecPluginError as exc:
                errors.append({{"message": str(exc), "entry_point": exc.entry_point, "group": exc.group,
                               "target": exc.target, "distribution": exc.distribution,
                               "unsupported": isinstance(exc, stepjournal.errors.UnsupportedValueError)}})
        # A payload of the plugin's codec name, written through a registry of its own.
        own = stepjournal.payloads.CodecRegistry(autoload=False)
        own.register(Thing, "brokenplug.Thing", encode=lambda t: {{}}, decode=lambda d: Thing())
        try:
            stepjournal.payloads.decode_payload(stepjournal.payloads.encode_payload(Thing(), registry=own))
        except stepjournal.errors.CodecPluginError as exc:
            errors.append({{"message": str(exc), "entry_point": exc.entry_point, "group": exc.group,
                           "unknown_codec": isinstance(exc, stepjournal.errors.UnknownCodecError)}})
        print(json.dumps({{"warnings": warnings.events, "errors": errors}}))
    """, extra_path=site)
    not_stored = [e for e in out["warnings"] if e["event"] == "output_not_stored"]
    assert [e["step"] for e in not_stored] == [1, 2]
    for event in not_stored:
        assert "codec plugin 'brokenplug.Thing'" in event["error"]
        assert "brokenplug_codecs_missing:register" in event["error"] and "ModuleNotFoundError" in event["error"]
    failed = [e for e in out["warnings"] if e["event"] == "codec_plugin_failed"]
    assert [(e["group"], e["entry_point"]) for e in failed] == [
        ("stepjournal.codecs", "brokenplug.Thing"),
        ("stepjournal.codecs", "brokenplug.Other"),
        ("stepjournal.codec_names", "brokenplug.Thing"),
    ]

    thing, again, other, decoded = out["errors"]
    assert thing == again
    assert thing["entry_point"] == "brokenplug.Thing" and thing["group"] == "stepjournal.codecs"
    assert thing["target"] == "brokenplug_codecs_missing:register" and thing["distribution"] == "brokenplug"
    assert thing["unsupported"] and "brokenplug 1.0" in thing["message"] and "reinstall brokenplug" in thing["message"]
    assert other["entry_point"] == "brokenplug.Other" and "registered no codec for brokenplug.Other" in other["message"]
    assert decoded["group"] == "stepjournal.codec_names" and decoded["unknown_codec"]
    assert "codec plugin 'brokenplug.Thing'" in decoded["message"] and "ModuleNotFoundError" in decoded["message"]


def _entry_points(group: str) -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["entry-points"][group]


def _run_target(target: str) -> CodecRegistry:
    module, _, attr = target.partition(":")
    registry = CodecRegistry(autoload=False)
    getattr(importlib.import_module(module), attr)(registry)
    return registry


def test_each_shipped_codec_has_one_entry_per_group_that_registers_what_it_is_named_after():
    pytest.importorskip("stepjournal.adapters.verl")
    by_type, by_name = _entry_points("stepjournal.codecs"), _entry_points("stepjournal.codec_names")
    assert sorted(by_type.values()) == sorted(by_name.values())  # each function in both groups, once
    names_of = {target: name for name, target in by_name.items()}
    for qualname, target in by_type.items():
        registry = _run_target(target)
        module, _, cls = qualname.rpartition(".")
        codec = registry.codec_for(getattr(importlib.import_module(module), cls))
        assert codec is not None, f"{target} registers no codec for {qualname}"
        assert codec.name == names_of[target], f"{qualname}'s codec is {codec.name!r}, its name entry says {names_of[target]!r}"
