"""Hostile bundles and remotes, the reported ones: typed errors, no traceback, memory bounded by the entry.

A head 60 000 levels deep ended in a `RecursionError`; one-byte changes of a bundle's ZIP headers in a
`NotImplementedError` or `UnicodeDecodeError`; a segment of nested empty msgpack arrays took ~70x its
size. Memory is measured in a fresh `spawn` child: its peak RSS (`ru_maxrss`) over its RSS just before
the call, against `sharing_fuzz.rss_allowed` (the bound docs/reliability.md states).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import random
import struct

import msgpack
import pytest

from reliability_support import report
from sharing_fuzz import _relist, build_seed, read_objects
from sharing_fuzz_run import measure_child, zip_bytes

from stepjournal.errors import IntegrityError, StepJournalError
from stepjournal.events import CallBypassed
from stepjournal.sharing import import_bundle, pull, verify_bundle
from stepjournal.events._convert import encode_event  # private: raw event bytes, as stored
from cli_support import run_cli as cli

MIB = 1 << 20


@pytest.fixture(scope="module")
def seed(tmp_path_factory):
    """(seed bundle path, its objects, the journal id) of a small real journal."""
    bundle, _remote = build_seed(str(tmp_path_factory.mktemp("seed")))
    objects = read_objects(bundle)
    source = next(k for k in objects if k.startswith("heads/"))[len("heads/"):-len(".json")]
    return bundle, objects, source


def write_both(folder, objects) -> tuple:
    """(bundle path, file:// URL) holding `objects`."""
    os.makedirs(folder, exist_ok=True)
    bundle = os.path.join(folder, "case.sjbundle")
    with open(bundle, "wb") as fh:
        fh.write(zip_bytes(objects, random.Random(0)))
    for name, data in objects.items():
        path = os.path.join(folder, "remote", name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(data)
    return bundle, f"file://{os.path.join(folder, 'remote')}"


def test_a_head_60000_levels_deep_is_an_integrity_error_naming_it(seed, tmp_path):
    _bundle, objects, source = seed
    for deep in (b"[" * 60_000 + b"]" * 60_000, b'{"a":' * 60_000 + b"1" + b"}" * 60_000):
        damaged = {**objects, f"heads/{source}.json": deep}
        bundle, url = write_both(str(tmp_path / str(len(deep))), damaged)
        with pytest.raises(IntegrityError, match=f"heads/{source}.json is not a JSON document of the layout"):
            pull(url, str(tmp_path / f"pulled-{len(deep)}"))
        with pytest.raises(IntegrityError, match=f"heads/{source}.json"):
            import_bundle(bundle, str(tmp_path / f"imported-{len(deep)}"))
        _events, problems = verify_bundle(bundle)
        assert [p.kind for p in problems] == ["head"]
        done = cli("verify", bundle)
        assert done.returncode == 1 and "Traceback" not in done.stderr + done.stdout
    deep_manifest = write_both(str(tmp_path / "manifest"), {**objects, "stepjournal-remote.json": b"[" * 60_000})[0]
    done = cli("import", deep_manifest, str(tmp_path / "cli-journal"))
    assert done.returncode != 0 and "Traceback" not in done.stderr and "stepjournal-remote.json" in done.stderr


def _header_offsets(data: bytes) -> list:
    """Every byte of the first entry's local header and of its central directory entry, and of the end record."""
    import zipfile
    import io

    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        first = archive.infolist()[0]
    local = range(first.header_offset, first.header_offset + 30 + len(first.filename))
    end = data.rfind(b"PK\x05\x06")
    central = struct.unpack_from("<I", data, end + 16)[0]
    return [*local, *range(central, central + 46 + len(first.filename)), *range(end, end + 22)]


def test_every_one_byte_change_of_a_zip_header_ends_in_success_or_a_typed_error(seed, tmp_path):
    bundle, _objects, _source = seed
    data = open(bundle, "rb").read()
    refused = 0
    for i, at in enumerate(_header_offsets(data)):
        for value in (0xFF, data[at] ^ 0x08):
            path = tmp_path / f"b{i}-{value}.sjbundle"
            path.write_bytes(data[:at] + bytes([value]) + data[at + 1:])
            for call in (lambda: verify_bundle(str(path)), lambda: import_bundle(str(path), str(tmp_path / f"j{i}-{value}"))):
                try:
                    call()
                except StepJournalError:
                    refused += 1
            path.unlink()
    assert refused > 0


@pytest.mark.parametrize("flags, raised", [(0x20, "NotImplementedError"), (0x800, "UnicodeDecodeError")])
def test_a_zip_header_zipfile_cannot_read_is_one_error_line_from_the_cli(seed, tmp_path, flags, raised):
    """A flag zipfile does not implement (compressed patched data) and a local name flagged UTF-8 that is
    not: once raw tracebacks, at the first entry read."""
    bundle, objects, _source = seed
    data = bytearray(open(bundle, "rb").read())
    end = data.rfind(b"PK\x05\x06")
    central = struct.unpack_from("<I", data, end + 16)[0]
    struct.pack_into("<H", data, central + 8, flags)  # the first entry's general purpose flags
    if raised == "UnicodeDecodeError":  # the local header's name then fails to decode as UTF-8
        data[30:31] = b"\xff"
    path = tmp_path / "damaged.sjbundle"
    path.write_bytes(bytes(data))
    for args in (("verify", str(path)), ("import", str(path), str(tmp_path / "journal"))):
        done = cli(*args)
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
        assert "bundle" in done.stderr


# -- memory ---------------------------------------------------------------------------------------------
def measure(tmp_path, objects) -> dict:
    """Peak RSS growth of verify_bundle, import_bundle and pull of `objects`, each in a fresh child."""
    bundle, url = write_both(str(tmp_path / "case"), objects)
    found = {}
    for kind, where in (("verify", bundle), ("import", bundle), ("pull", url)):
        out = str(tmp_path / f"{kind}.json")
        proc = mp.get_context("spawn").Process(target=measure_child, args=(kind, where, str(tmp_path / kind), out))
        proc.start()
        proc.join(600)
        assert proc.exitcode == 0
        with open(out, encoding="utf-8") as fh:
            found[kind] = json.load(fh)
    return found


def _with_segment(objects: dict, source: str, body: bytes, last: int) -> dict:
    head = json.loads(objects[f"heads/{source}.json"])
    name = f"segments/{source}/{1:020d}-{last:020d}.msgpack"
    head["segments"] = [{"name": name, "first": 1, "last": last, "count": last, "nbytes": 0, "digest": ""}]
    head["last_seq"] = last
    out = {k: v for k, v in objects.items() if not k.startswith("segments/")}
    out[f"heads/{source}.json"] = json.dumps(head).encode()
    out[name] = body
    _relist(out, name, body)  # its digest matches: the parser, not the digest, must refuse it
    return out


def test_a_64_mib_segment_of_nested_empty_arrays_costs_a_small_multiple_of_its_size(seed, tmp_path):
    from sharing_fuzz import rss_allowed

    _bundle, objects, source = seed
    n = 64 * MIB
    body = (b"\x83" + msgpack.packb("format") + b"\x01" + msgpack.packb("source") + msgpack.packb(source)
            + msgpack.packb("events") + b"\xdd" + struct.pack(">I", n) + b"\x90" * n)
    found = measure(tmp_path, _with_segment(objects, source, body, 14))
    assert found["verify"]["outcome"] == "1 problems"  # the segment, named
    assert found["import"]["outcome"] == found["pull"]["outcome"] == "IntegrityError"
    for kind, seen in found.items():
        assert seen["growth"] <= rss_allowed(len(body)), (kind, seen["growth"] >> 20)
    report("sharing_memory_nested_segment", entry_mb=len(body) >> 20,
           **{f"{k}_growth_mb": v["growth"] >> 20 for k, v in found.items()})


def test_a_16_mib_segment_of_real_events_costs_a_small_multiple_of_its_size(seed, tmp_path):
    """The honest worst: the smallest events, so the most of them, each decoded."""
    from sharing_fuzz import rss_allowed

    _bundle, objects, source = seed
    event = encode_event(CallBypassed(session="s", run="fuzz", step=1, gen_index=0, mode="validate",
                                      policy="bypass", reason="x", ts=1.0))
    count = 16 * MIB // (len(event) + 8)
    body = msgpack.packb({"format": 1, "source": source, "events": [[i + 1, event] for i in range(count)]},
                         use_bin_type=True)
    found = measure(tmp_path, _with_segment(objects, source, body, count))
    assert found["import"]["outcome"] == found["pull"]["outcome"] == f"{count} events"
    for kind, seen in found.items():
        assert seen["growth"] <= rss_allowed(len(body)), (kind, seen["growth"] >> 20)
    report("sharing_memory_event_segment", entry_mb=len(body) >> 20, events=count,
           **{f"{k}_growth_mb": v["growth"] >> 20 for k, v in found.items()})
