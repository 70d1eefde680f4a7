"""`stepjournal export` on values that are legitimate but awkward, and on many tensors.

A lone surrogate in a string and an int of 20 000 digits once crashed `export` (a UTF-8 file cannot
hold the one, Python's int-to-str limit refuses the other); 32 000 zero-size tensors took 47 s,
probing every key taken for each new one and writing a file per tensor.
"""

from __future__ import annotations

import json
import os

import numpy as np
import torch
from safetensors import safe_open

from stepjournal import Journal
from stepjournal.tools._export import _Flattener  # private: the exporter's internals
from cli_support import run_cli as _cli

HUGE = 7 ** 23_666  # 20 000 decimal digits (more than the 4 300 Python writes)


def test_export_writes_a_lone_surrogate_and_a_20000_digit_int_and_reads_them_back(tmp_path):
    path = str(tmp_path / "journal")
    value = {"text": "half \ud800 a pair", "big": HUGE, "neg": -HUGE, "\udfffkey": torch.ones(2)}
    with Journal(path, run="odd") as journal:
        journal.record(1, value)
    result = _cli("export", path, "--to", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    folder = tmp_path / "out" / "step_000001_idx_0"
    rest = json.loads((folder / "rest.json").read_text(encoding="ascii"))["value"]
    assert rest["text"] == "half \ud800 a pair"
    assert int(rest["big"]["$int"], 16) == HUGE and int(rest["neg"]["$int"], 16) == -HUGE
    node = rest["\udfffkey"]
    with safe_open(str(folder / node["file"]), framework="pt") as f:
        assert torch.equal(f.get_tensor(node["$tensor"]), torch.ones(2))
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text(encoding="ascii"))
    assert manifest["entries"][0]["tensors"][0]["key"] == node["$tensor"]


def _count_probes(flat: _Flattener) -> list:
    probes = [0]

    class CountingSet(set):
        def __contains__(self, item):
            probes[0] += 1
            return super().__contains__(item)

    flat._taken = CountingSet()
    return probes


def _flatten(tmp_path, n: int, value) -> tuple[int, list]:
    folder = tmp_path / f"flat{n}"
    folder.mkdir()
    flat = _Flattener(str(folder), "tensors.safetensors", "raw.bin")
    probes = _count_probes(flat)
    try:
        flat.walk(value, ())
    finally:
        flat.close()
    return probes[0], sorted(os.listdir(folder))


def test_flattening_is_linear_in_the_number_of_tensors_and_writes_one_raw_file(tmp_path):
    counts = {}
    for n in (2_000, 8_000):
        # complex tensors go to the raw file, one path each
        value = {i: torch.zeros(0, dtype=torch.complex128) for i in range(n)}
        counts[n] = _flatten(tmp_path, n, value)
    assert counts[2_000][1] == counts[8_000][1] == ["raw.bin"]
    assert counts[8_000][0] <= 5 * counts[2_000][0], counts


def test_export_of_8000_zero_size_tensors_writes_a_handful_of_files(tmp_path):
    path = str(tmp_path / "journal")
    value = {"plain": [torch.zeros(0) for _ in range(4_000)],
             "complex": [torch.zeros(0, dtype=torch.complex128) for _ in range(4_000)],
             "words": np.array(["a", "bc"])}
    with Journal(path, run="many") as journal:
        journal.record(1, value)
    result = _cli("export", path, "--to", str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    folder = tmp_path / "out" / "step_000001_idx_0"
    assert sorted(os.listdir(folder)) == ["raw.bin", "rest.json", "tensors.safetensors"]
    rest = json.loads((folder / "rest.json").read_text())["value"]
    node = rest["words"]
    data = (folder / node["file"]).read_bytes()[node["offset"]:node["offset"] + node["nbytes"]]
    assert np.array_equal(np.frombuffer(data, dtype=node["dtype"]).reshape(node["shape"]), value["words"])
    assert len({n["$tensor"] for n in rest["complex"]}) == 4_000


def test_keys_taken_at_one_path_cost_probes_linear_in_their_number(tmp_path):
    probes = {}
    for n in (2_000, 8_000):
        flat = _Flattener(str(tmp_path), "tensors.safetensors", "raw.bin")
        counter = _count_probes(flat)
        keys = [flat.key(("same",)) for _ in range(n)]
        assert len(set(keys)) == n and keys[:3] == ["same", "same~2", "same~3"]
        probes[n] = counter[0]
    assert probes[8_000] <= 5 * probes[2_000], probes


def test_export_to_a_link_to_nowhere_is_refused_in_one_line_and_creates_nothing_where_it_points(tmp_path):
    """A link to nowhere at ``--to`` is a name taken, not a new folder: refused as a target that exists, never
    made through the link (where the export's files would land outside the folder named)."""
    path = str(tmp_path / "journal")
    with Journal(path, run="r") as journal:
        journal.record(1, {"ids": torch.arange(4)})
    os.symlink(tmp_path / "nowhere", tmp_path / "out")
    result = _cli("export", path, "--to", str(tmp_path / "out"))
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and "exists and is not an empty folder" in result.stderr, result.stderr
    assert not os.path.lexists(tmp_path / "nowhere")
