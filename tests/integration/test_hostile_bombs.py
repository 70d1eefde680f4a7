"""Decompression bombs and a big journal's verify, measured in spawned children.

Each scenario runs in a fresh `spawn` child that reports how much its peak RSS grew
(`ru_maxrss` before and after), and with its address space capped (RLIMIT_AS) a little above what
it had, so that a decompression sized by the attacker fails loudly instead of passing on a big
machine. Bombs are planted with py-lmdb straight into the ``payloads`` database.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import resource
import struct

import pytest
import zstandard

from lmdb_raw import put_raw

ONE_TIB = 1 << 40
SIXTY_GIB = 60 << 30
BOMB_BYTES = 1 << 30  # a real frame: 1 GiB of zeros in about 32 KB (the reported one: 98 KB -> 3 GiB)
# Peak RSS a scenario may add to its child (the journals' payloads are at most a few MB).
ALLOWED_GROWTH = 200 << 20


def lying_frame(claimed: int) -> bytes:
    """A zstd frame header claiming `claimed` bytes, followed by one raw block of 16 bytes."""
    fhd = 0xC0  # 8-byte frame content size, window descriptor present, no checksum, no dictionary
    block = struct.pack("<I", (16 << 3) | 1)[:3]  # last block, raw, 16 bytes
    return zstandard.FRAME_HEADER + bytes([fhd, 0x58]) + struct.pack("<Q", claimed) + block + b"\0" * 16


def real_bomb(size: int) -> bytes:
    """A real zstd frame that decompresses to `size` zero bytes (compressed without holding them)."""
    cobj = zstandard.ZstdCompressor(level=19).compressobj(size=size)
    zeros = bytes(1 << 24)
    out = [cobj.compress(zeros) for _ in range(size // len(zeros))]
    return b"".join(out) + cobj.flush()


def _vm_size() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmSize:"))


def _scenario(name: str, path: str, out: str) -> None:
    from stepjournal import Journal
    from stepjournal.errors import IntegrityError, StepJournalError

    result: dict = {}
    journal = Journal(path, run="bomb")
    journal.verify()  # warm: imports, the structure walk, the first mapping
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (_vm_size() + (1 << 30), hard))
    try:
        if name == "verify":
            result["problems"] = [(p.kind, p.detail) for p in journal.verify()]
        elif name == "load":
            recorded = journal.lookup(1)
            try:
                journal.load_output(recorded)
                result["error"] = None
            except StepJournalError as exc:
                result["error"] = [type(exc).__name__, str(exc), isinstance(exc, IntegrityError)]
        elif name == "record":
            journal.record(2, {"x": list(range(100))})
            result["value"] = journal.load_output(journal.lookup(2))
            result["problems"] = [(p.kind, p.detail) for p in journal.verify()]
    except BaseException as exc:  # reported to the parent, which fails on anything untyped
        result["raised"] = f"{type(exc).__name__}: {exc}"
    resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    result["growth"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    journal.close()
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(result, fh)


def run_child(name: str, path: str, tmp_path) -> dict:
    out = str(tmp_path / f"{name}.json")
    proc = mp.get_context("spawn").Process(target=_scenario, args=(name, path, out))
    proc.start()
    proc.join(600)
    assert proc.exitcode == 0, f"the child died ({proc.exitcode})"
    with open(out, encoding="utf-8") as fh:
        result = json.load(fh)
    assert "raised" not in result, result["raised"]
    assert result["growth"] < ALLOWED_GROWTH, f"peak RSS grew by {result['growth'] >> 20} MiB"
    return result


def _journal(tmp_path, compression="zstd") -> tuple[str, bytes]:
    from stepjournal import Journal

    path = str(tmp_path / "journal")
    with Journal(path, run="bomb", compression=compression) as journal:
        recorded = journal.record(1, {"tokens": list(range(1000))})
    return path, bytes.fromhex(recorded.event.output.digest)


@pytest.mark.parametrize("claimed", [ONE_TIB, SIXTY_GIB], ids=["1TiB", "60GiB"])
def test_a_frame_claiming_more_than_its_event_declares_is_refused_by_load_and_verify(tmp_path, claimed):
    path, digest = _journal(tmp_path)
    put_raw(path, "payloads", digest, lying_frame(claimed))
    loaded = run_child("load", path, tmp_path)
    assert loaded["error"][0] == "IntegrityError" and f"claims {claimed} bytes" in loaded["error"][1]
    verified = run_child("verify", path, tmp_path)
    assert [kind for kind, _ in verified["problems"]] == ["payload"]
    assert f"claims {claimed} bytes" in verified["problems"][0][1]


@pytest.mark.parametrize("claimed", [SIXTY_GIB, ONE_TIB], ids=["60GiB", "1TiB"])
def test_an_orphan_frame_claiming_more_than_the_orphan_cap_is_one_verify_problem(tmp_path, claimed):
    from stepjournal.payloads._payloads import MAX_ORPHAN_NBYTES  # private: the payload pipeline's limits

    path, _ = _journal(tmp_path)
    put_raw(path, "payloads", b"\x07" * 32, lying_frame(claimed))
    verified = run_child("verify", path, tmp_path)
    assert verified["problems"] == [
        ["payload", f"payload {'07' * 8}… claims {claimed} bytes, expected at most {MAX_ORPHAN_NBYTES}"]
    ]


def test_a_real_one_gib_bomb_as_an_orphan_is_streamed_through_the_digest_in_bounded_memory(tmp_path):
    path, _ = _journal(tmp_path)
    bomb = real_bomb(BOMB_BYTES)
    assert len(bomb) < 100_000
    put_raw(path, "payloads", b"\x07" * 32, bomb)
    verified = run_child("verify", path, tmp_path)
    assert verified["problems"] == [["payload", "bytes do not match the digest"]]


def test_a_real_bomb_under_an_events_digest_is_refused_before_decompressing(tmp_path):
    path, digest = _journal(tmp_path)
    put_raw(path, "payloads", digest, real_bomb(BOMB_BYTES))
    loaded = run_child("load", path, tmp_path)
    assert loaded["error"][0] == "IntegrityError" and f"claims {BOMB_BYTES} bytes" in loaded["error"][1]


def test_a_frame_that_decompresses_past_what_it_claims_is_an_integrity_error():
    from stepjournal.errors import IntegrityError
    from stepjournal.payloads._payloads import unwrap  # private: the payload pipeline's limits

    bomb = real_bomb(1 << 27)
    assert bomb[4] == 0x80, "the test needs a 4-byte size field after a window descriptor"
    for claimed in (1 << 27) - 4096, 1 << 20:  # streamed, and decompressed at once
        lie = bomb[:6] + struct.pack("<I", claimed) + bomb[10:]  # the same frame, claiming less
        assert zstandard.get_frame_parameters(lie).content_size == claimed
        with pytest.raises(IntegrityError, match="decompresses past|does not decompress"):
            unwrap(lie, "ab" * 32, 3, 1 << 27)


@pytest.mark.parametrize("bomb", ["lying", "real"])
def test_recording_a_value_whose_digest_holds_a_planted_bomb_replaces_the_bomb(tmp_path, bomb):
    from stepjournal import Journal

    path = str(tmp_path / "journal")
    with Journal(path, run="bomb", compression="zstd") as journal:
        journal.record(1, {"x": 1})
        digest = journal.prepare({"x": list(range(100))}).key
    put_raw(path, "payloads", digest, lying_frame(ONE_TIB) if bomb == "lying" else real_bomb(BOMB_BYTES))
    recorded = run_child("record", path, tmp_path)
    assert recorded["value"] == {"x": list(range(100))}
    assert recorded["problems"] == []
