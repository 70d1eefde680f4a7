"""`import-verl --trust-pickle` trusts the pickles of one folder, never a file a link in it points at.

A ``gen_batch.dp`` linking outside DUMP_DIR was once listed as "link leaves the dump folder; not
read", and then loaded and unpickled anyway (the step folder was still found). Every file the
import reads is now opened through one check: its resolved path lies inside the dump folder, and it
is opened with ``O_NOFOLLOW``.
"""

from __future__ import annotations

import json
import os
import pickle

import pytest

from stepjournal.adapters.verl import VerlDumpError, import_verl_dumps
from stepjournal.adapters.verl._import import _open_inside  # private: a verl adapter internal under test

from test_verl_import import FOLDER, RUN, Marker, fresh_skip_manager, skip_manager_dumps  # noqa: F401
from cli_support import run_cli


def _outside_pickle(tmp_path) -> tuple[str, str]:
    outside = tmp_path / "elsewhere"
    outside.mkdir(exist_ok=True)
    marker = str(tmp_path / "unpickled")
    (outside / "gen_batch.dp").write_bytes(pickle.dumps(Marker(marker)))
    (outside / "meta.json").write_text(json.dumps({"global_steps": 2}))
    return str(outside), marker


def _dumps_with_a_link_out(tmp_path, step: str, name: str) -> tuple[str, str, str, str]:
    """verl's own dumps, with `name` of step folder `step` replaced by a link to a file outside."""
    _, dump_dir, _ = skip_manager_dumps(tmp_path)
    outside, marker = _outside_pickle(tmp_path)
    inside = os.path.join(dump_dir, RUN, FOLDER, step, name)
    os.remove(inside)
    os.symlink(os.path.join(outside, name), inside)
    return dump_dir, outside, marker, inside


def test_a_gen_batch_linking_out_of_the_dump_folder_is_never_unpickled_from_the_cli(tmp_path):
    dump_dir, _, marker, _ = _dumps_with_a_link_out(tmp_path, "2", "gen_batch.dp")
    journal = str(tmp_path / "j")
    result = run_cli("import-verl", dump_dir, "--into", journal, "--trust-pickle", "--json")
    assert not os.path.exists(marker), "a pickle outside the dump folder was loaded"
    report = json.loads(result.stdout)
    assert [r["step"] for r in report["imported"]] == [1, 3]
    assert any("link leaves the dump folder" in s["reason"] for s in report["skipped"])


def test_a_meta_json_linking_out_of_the_folder_is_not_read_and_the_step_fails(tmp_path):
    dump_dir, outside, _, meta = _dumps_with_a_link_out(tmp_path, "3", "meta.json")
    report = import_verl_dumps(dump_dir, tmp_path / "j", trust_pickle=True)
    assert [r.step for r in report.imported] == [1, 2]
    assert [f.reason for f in report.failed] == [
        f"VerlDumpError: {meta} is a link that leaves the dump folder ({os.path.realpath(outside)}/meta.json); not read"
    ]


def test_a_link_inside_the_dump_folder_is_read_and_one_leaving_it_or_a_fifo_is_refused(tmp_path):
    root = tmp_path / "dumps"
    root.mkdir()
    (root / "real.dp").write_bytes(b"inside")
    os.symlink(root / "real.dp", root / "alias.dp")
    outside, _ = _outside_pickle(tmp_path)
    os.symlink(os.path.join(outside, "gen_batch.dp"), root / "out.dp")
    os.mkfifo(root / "pipe.dp")
    real_root = os.path.realpath(root)
    with _open_inside(real_root, str(root / "alias.dp")) as fh:
        assert fh.read() == b"inside"
    with pytest.raises(VerlDumpError, match="leaves the dump folder"):
        _open_inside(real_root, str(root / "out.dp"))
    with pytest.raises(VerlDumpError, match="not a plain file"):
        _open_inside(real_root, str(root / "pipe.dp"))
