"""The record and replay fast paths give the same bytes and values as the plain ones (issue 7).

Speed is measured by `make bench`, never asserted here.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from stepjournal import Journal
from stepjournal.errors import IntegrityError
from stepjournal.payloads import decode_payload, encode_payload
from stepjournal.payloads._codec import encode_payload_array  # private: the codec's internals
from stepjournal.payloads._codec_encode import _encode  # private: the encoder's internals
from stepjournal.tools import digest_hex
from stepjournal.base._pages import ReleaseBehind, releaser  # private: page release under test

from lmdb_raw import flip_payload_byte

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pages are released on Linux only")

VALUES = [
    {"ids": torch.arange(1000), "lp": torch.randn(3, 5).t(), "uid": np.array(["a", "b"], dtype=object)},
    [torch.ones(1, dtype=torch.bool), torch.zeros(0), np.zeros((0, 3)), torch.arange(7, dtype=torch.int16)],
    {"bf16": torch.ones(5, dtype=torch.bfloat16), "empty": torch.empty(0, 4), "arr": np.arange(9.0)},
    "just a string",
]


def _dirty(size: int) -> np.ndarray:
    out = np.empty(size, dtype=np.uint8)
    out[:] = 0xAB
    return out


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_array_encoding_writes_the_same_bytes_as_bytearray_encoding_even_into_dirty_memory(value):
    expected = bytes(encode_payload(value))
    assert encode_payload_array(value).tobytes() == expected
    assert _encode(value, None, _dirty).tobytes() == expected  # padding is zeroed, not inherited


def test_decoded_tensors_own_writable_memory_of_their_dtype():
    value = {"big": torch.arange(1 << 20, dtype=torch.int64), "half": torch.ones(3, dtype=torch.float16)}
    decoded = decode_payload(encode_payload(value))
    assert decoded["big"].dtype == torch.int64 and decoded["half"].dtype == torch.float16
    decoded["big"] += 1  # writable
    assert torch.equal(decoded["big"], torch.arange(1, (1 << 20) + 1))


def test_releaser_refuses_memory_that_is_not_a_journal_mapping(tmp_path):
    data_file = str(tmp_path / "data.mdb")
    assert releaser(bytes(4 << 20), data_file) is None  # anonymous memory: DONTNEED would zero it
    assert releaser(bytearray(4 << 20), data_file) is None
    assert releaser(memoryview(bytes(16)), data_file) is None


@linux_only
def test_a_large_replay_releases_its_mapped_pages_and_still_reads_right(jpath, lmdb_payloads):
    value = {"x": torch.arange(4 << 20, dtype=torch.int64), "y": torch.randn(1024, 256)}
    with Journal(jpath) as journal:
        recorded = journal.record(1, value)
        key = bytes.fromhex(recorded.event.output.digest)
        with journal.payload_store.view(key) as (_, release):
            assert release is not None  # the LMDB store's view lies in data.mdb's mapping
        for _ in range(2):  # the second load reads pages the first one released
            out = journal.load_output(recorded)
            assert torch.equal(out["x"], value["x"]) and torch.equal(out["y"], value["y"])


@pytest.mark.parametrize("where", ["files", "lmdb"])
@pytest.mark.parametrize("offset", [20, -1], ids=["header", "data"])
def test_a_damaged_large_payload_reports_the_digest_mismatch_not_a_decode_error(jpath, request, offset, where):
    """A payload file, and a value in LMDB's map (hashed beside the decode; a journal made before payload files)."""
    if where == "lmdb":
        request.getfixturevalue("lmdb_payloads")
    value = {"x": torch.arange(1 << 20, dtype=torch.int64)}  # 8 MB
    with Journal(jpath) as journal:
        recorded = journal.record(1, value)
    flip_payload_byte(jpath, bytes.fromhex(recorded.event.output.digest), offset)
    with Journal(jpath, readonly=True) as journal:
        with pytest.raises(IntegrityError, match="does not match its digest"):
            journal.load_output(journal.lookup(1))


def test_pages_are_released_only_behind_every_reader_and_only_once():
    released = []
    behind = ReleaseBehind(lambda start, stop: released.append((start, stop)), 2)
    digest, decoder = behind.reader(0), behind.reader(1)
    digest(0, 100)
    assert released == []  # the decoder has not read anything yet
    decoder(64, 80)
    digest(100, 200)
    decoder(90, 150)
    assert released == [(0, 80), (80, 150)]


@pytest.mark.parametrize("size", [1000, 3 << 20], ids=["small", "large"])
def test_prepare_digest_is_the_digest_of_the_bytearray_encoding(jpath, size):
    value = {
        "a": torch.arange(size, dtype=torch.int64),
        "b": torch.randn(64, 33).t(),  # strided: copied by torch, not numpy
        "c": np.arange(size // 7, dtype=">i4"),
        "s": "text",
    }
    with Journal(jpath) as journal:
        prepared = journal.prepare(value)
    assert prepared.ref.digest == digest_hex(encode_payload(value))

