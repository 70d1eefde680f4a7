"""The fast decode path builds the same events the converter does, and steps aside for anything odd."""

from __future__ import annotations

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st

from stepjournal.events import CallBypassed, GenerationRecorded, PayloadRef, ReplayServed
from stepjournal.events._convert import (  # private: raw event bytes, as stored
    _decode_fast, converter, decode_event, encode_event,
)

ref = st.builds(
    PayloadRef,
    digest=st.just("ab" * 32),
    nbytes=st.integers(0, 2**40),
    stored_nbytes=st.integers(0, 2**40),
    compression=st.sampled_from([None, "zstd"]),
)
common = dict(
    session=st.text("abcdef0123", min_size=1, max_size=12),
    run=st.text("abcxyz-_", min_size=1, max_size=10),
    step=st.integers(0, 2**63 - 1),
    gen_index=st.integers(0, 2**32 - 1),
    mode=st.sampled_from(["train", "validate"]),
    policy=st.sampled_from(["cache", "nearest@1-5"]),
    reason=st.text(max_size=30),
    ts=st.floats(0, 2e9),
)
events = st.one_of(
    st.builds(GenerationRecorded, input_digest=st.none() | st.just("cd" * 32), output=st.none() | ref,
              input=st.none() | ref, duration_s=st.floats(0, 1e4) | st.integers(0, 100), **common),
    st.builds(ReplayServed, input_digest=st.none(), source_seq=st.integers(1, 2**40), source_run=st.just("r"),
              source_step=st.integers(0, 10**9), source_gen_index=st.integers(0, 5), output=ref, **common),
    st.builds(CallBypassed, **common),
)


@settings(max_examples=200, deadline=None)
@given(event=events)
def test_the_fast_path_decodes_every_written_event_to_what_the_converter_builds(event):
    raw = encode_event(event)
    body = msgpack.unpackb(raw)
    for key in ("type", "v", "crc32"):
        body.pop(key)
    expected = converter.structure(body, type(event))
    fast = _decode_fast(raw)
    assert fast is not None and fast == expected == decode_event(raw)


@settings(max_examples=200, deadline=None)
@given(event=events, at=st.integers(0, 10_000), bit=st.integers(0, 7))
def test_a_flipped_bit_never_gets_through_the_fast_path(event, at, bit):
    raw = bytearray(encode_event(event))
    raw[at % len(raw)] ^= 1 << bit
    assert _decode_fast(bytes(raw)) is None
