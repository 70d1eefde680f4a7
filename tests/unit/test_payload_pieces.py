"""A record writes a large payload from the tensors' own memory: the encoding's pieces (`encode_payload_parts`)
go to the payload file as they are, with the same bytes and digest as the joined encoding."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import stepjournal.payloads._file_store as file_store  # private: the file store's layout
from stepjournal import Journal
from stepjournal.payloads import encode_payload
from stepjournal.payloads._codec import encode_payload_parts  # private: the codec's internals
from stepjournal.base._digest import digest_bytes, digest_pieces  # private: digests as the store computes them
from stepjournal.payloads._payload_store import FILE_FROM  # private: the store's internals

N = FILE_FROM // 8 + 1024  # int64 elements: a payload file


def values():
    base = torch.arange(4 * N, dtype=torch.int64)
    return {
        "contiguous": {"ids": base[:N].clone(), "text": "x" * 100},
        "strided": {"ids": base[::4].clone().reshape(-1, 2).t()},  # a transposed view: copied once
        "mixed": {"a": torch.randn(2 * N), "b": np.arange(N // 2, dtype=np.int32), "c": torch.tensor([1 + 2j]).conj(),
                  "d": torch.ones(N // 4, dtype=torch.bfloat16), "e": np.arange(24.0).reshape(4, 6)[:, ::2],
                  "f": torch.zeros(0), "g": [1, "two", None]},
    }


@pytest.mark.parametrize("name", ["contiguous", "strided", "mixed"])
def test_the_pieces_join_into_the_encoding_and_hash_to_its_digest(name):
    value = values()[name]
    whole = bytes(encode_payload(value))
    pieces = encode_payload_parts(value)
    assert b"".join(bytes(memoryview(p).cast("B")) for p in pieces) == whole
    assert digest_pieces(pieces) == digest_bytes(whole)


def test_a_contiguous_tensor_is_a_piece_of_its_own_memory_not_a_copy():
    ids = torch.arange(N)
    pieces = encode_payload_parts({"ids": ids})
    assert any(np.shares_memory(np.asarray(p), ids.numpy()) for p in pieces if isinstance(p, np.ndarray))


@pytest.mark.parametrize("name", ["contiguous", "strided", "mixed"])
def test_a_record_writes_the_tensors_own_memory_into_its_payload_file_and_replays_it(tmp_path, monkeypatch, name):
    value = values()[name]
    written = []
    real = os.writev

    def spy(fd, buffers):
        written.extend(np.frombuffer(b, dtype=np.uint8).__array_interface__["data"][0] for b in buffers)
        return real(fd, buffers)

    monkeypatch.setattr(file_store.os, "writev", spy)
    with Journal(tmp_path / "j") as journal:
        digest = journal.record(1, value).event.output.digest
        assert digest == digest_bytes(bytes(encode_payload(value))).hex()
        if name == "contiguous":  # the tensor's own bytes went to the file: no copy of them was made
            assert value["ids"].data_ptr() in written
    assert os.path.isfile(tmp_path / "j" / "payloads" / digest[:2] / digest[2:])
    with Journal(tmp_path / "j", readonly=True) as journal:
        got = journal.load_output(journal.lookup(1))
        assert journal.verify() == []
    for key, want in value.items():
        if isinstance(want, torch.Tensor):
            assert got[key].dtype == want.dtype and torch.equal(got[key], want)
        elif isinstance(want, np.ndarray):
            assert np.array_equal(got[key], want)
        else:
            assert got[key] == want


def test_a_small_value_prepared_as_pieces_is_joined_into_lmdb_and_a_prepared_payload_is_a_copy(tmp_path):
    with Journal(tmp_path / "j") as journal:
        small = {"ids": torch.arange(10)}
        digest = journal.record(1, small).event.output.digest
        assert not os.path.exists(tmp_path / "j" / "payloads" / digest[:2])
        held = {"ids": torch.arange(N)}
        prepared = journal.prepare(held)  # the public default copies: changing the value later changes nothing
        held["ids"][0] = -1
        journal.record(2, prepared)
        assert journal.load_output(journal.lookup(2))["ids"][0] == 0 and journal.verify() == []
