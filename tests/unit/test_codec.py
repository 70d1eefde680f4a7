"""Behaviour of the pickle-free payload codec: exact round trips, clear refusals, hostile input."""

from __future__ import annotations

import collections
import json
import math
import struct
import time

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from stepjournal.payloads._codec import (  # private: the codec's internals
    MAX_DEPTH,
    PAYLOAD_MAGIC,
    CodecRegistry,
    decode_payload,
    decode_payload_releasing,
    default_registry,
    describe_payload,
    encode_payload,
    register_codec,
)
from stepjournal.errors import PayloadDecodeError, UnknownCodecError, UnsupportedValueError
from stepjournal.base._pages import owned_buffer  # private: page release under test

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Every dtype torch has, found the same way a new torch release would add one: by looking.
ALL_TORCH_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
QUANTIZED = {torch.qint8, torch.quint8, torch.qint32, torch.quint4x2, torch.quint2x4}
PLAIN_TORCH_DTYPES = [d for d in ALL_TORCH_DTYPES if d not in QUANTIZED]
_SAME_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# ---------------------------------------------------------------------------------------------
# Helpers


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The C-order bytes of any tensor, also for dtypes (uint4, float8...) that cannot be copied."""
    width = _SAME_WIDTH.get(t.element_size())
    as_int = t.resolve_conj().view(width) if width is not None else t.resolve_conj()
    return as_int.numpy().tobytes()


def assert_same(expected, actual) -> None:
    """Assert two values are equal bit for bit, down to container, dtype and scalar types."""
    assert type(actual) is type(expected)
    if isinstance(expected, dict):
        assert len(actual) == len(expected)
        for (ek, ev), (ak, av) in zip(expected.items(), actual.items()):
            assert_same(ek, ak)
            assert_same(ev, av)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for e, a in zip(expected, actual):
            assert_same(e, a)
    elif isinstance(expected, float):
        assert struct.pack("<d", actual) == struct.pack("<d", expected)
    elif isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype
        assert actual.shape == expected.shape
        assert actual.device.type == "cpu"
        assert actual.is_contiguous()
        assert not actual.requires_grad
        assert tensor_bytes(actual) == tensor_bytes(expected)
    elif isinstance(expected, np.ndarray):
        assert actual.dtype.str == expected.dtype.str
        assert actual.shape == expected.shape
        if expected.dtype.kind == "O":
            for e, a in zip(expected.flat, actual.flat):
                assert_same(e, a)
        else:
            assert actual.tobytes() == expected.tobytes()
    elif isinstance(expected, np.generic):
        assert actual.dtype.str == expected.dtype.str
        assert actual.tobytes() == expected.tobytes()
    else:
        assert actual == expected


def round_trip(value, registry: CodecRegistry | None = None):
    return decode_payload(encode_payload(value, registry=registry), registry=registry)


def frame(header: bytes, data: bytes = b"") -> bytes:
    """Wrap raw header bytes and a data section into a payload, as the format lays them out."""
    prefix = PAYLOAD_MAGIC + bytes([1, 0, 0, 0]) + struct.pack("<Q", len(header))
    body = prefix + header
    return body + bytes(-len(body) % 64) + data


def decode_or_reject(data) -> None:
    """Decode hostile bytes; anything but success or PayloadDecodeError fails the test."""
    try:
        decode_payload(data)
    except PayloadDecodeError:
        pass


# ---------------------------------------------------------------------------------------------
# Strategies

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)


@st.composite
def tensors(draw, dtypes=st.sampled_from(PLAIN_TORCH_DTYPES)):
    """A tensor of any plain dtype filled with random bits (nans and all), maybe non-contiguous."""
    dtype = draw(dtypes)
    shape = draw(shapes)
    numel = math.prod(shape)
    raw = draw(st.binary(min_size=numel * dtype.itemsize, max_size=numel * dtype.itemsize))
    t = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    t = t.view(dtype).reshape(shape)
    layout = draw(st.sampled_from(["contiguous", "transposed", "strided", "expanded"]))
    if layout == "transposed" and t.dim() >= 2:
        t = t.transpose(0, 1)
    elif layout == "strided" and t.dim() >= 1:
        t = t[::2]
    elif layout == "expanded" and t.dim() >= 1 and t.shape[0] == 1:
        t = t.expand(3, *t.shape[1:])
    return t


numpy_dtypes = (
    hnp.boolean_dtypes()
    | hnp.integer_dtypes(endianness="?")
    | hnp.unsigned_integer_dtypes(endianness="?")
    | hnp.floating_dtypes(endianness="?")
    | hnp.complex_number_dtypes(endianness="?")
    | hnp.datetime64_dtypes(endianness="?")
    | hnp.timedelta64_dtypes(endianness="?")
    | hnp.byte_string_dtypes(endianness="?", max_len=6)
    | hnp.unicode_string_dtypes(endianness="?", max_len=6)
)


@st.composite
def numpy_arrays(draw):
    """A numpy array of any allowed dtype and byte order, maybe a non-contiguous view."""
    array = draw(hnp.arrays(numpy_dtypes, shapes))
    layout = draw(st.sampled_from(["contiguous", "transposed", "reversed"]))
    if layout == "transposed":
        array = array.T
    elif layout == "reversed" and array.ndim >= 1:
        array = array[::-1]
    return array


@st.composite
def numpy_scalars(draw):
    dtype = draw(
        hnp.boolean_dtypes()
        | hnp.integer_dtypes()
        | hnp.unsigned_integer_dtypes()
        | hnp.floating_dtypes()
        | hnp.complex_number_dtypes()
        | hnp.datetime64_dtypes()
    )
    return draw(hnp.arrays(dtype, 1))[0]


scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=2**64 - 3, max_value=2**64 + 3)
    | st.integers(min_value=-(2**63) - 3, max_value=-(2**63) + 3)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.binary(max_size=20)
)
keys = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.tuples(inner, inner),
    max_leaves=4,
)


def object_array(items: list, shape_2d: bool):
    array = np.empty(len(items), dtype=object)
    for i, item in enumerate(items):
        array[i] = item
    return array.reshape(1, len(items)) if shape_2d else array


def containers(children):
    return (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(keys, children, max_size=4)
        | st.builds(object_array, st.lists(children, max_size=4), st.booleans())
    )


values = st.recursive(scalars | tensors() | numpy_arrays() | numpy_scalars(), containers, max_leaves=12)


# ---------------------------------------------------------------------------------------------
# Round trips


@SETTINGS
@given(values)
def test_any_supported_value_round_trips_exactly(value):
    assert_same(value, round_trip(value))


@SETTINGS
@given(tensors())
def test_tensor_of_any_dtype_and_layout_round_trips_bit_exact(tensor):
    assert_same(tensor, round_trip(tensor))


@SETTINGS
@given(numpy_arrays())
def test_numpy_array_round_trips_with_its_byte_order(array):
    assert_same(array, round_trip(array))


@SETTINGS
@given(numpy_scalars())
def test_numpy_scalar_round_trips_as_numpy_scalar(scalar):
    assert_same(scalar, round_trip(scalar))


@pytest.mark.parametrize("dtype", PLAIN_TORCH_DTYPES, ids=str)
def test_every_plain_torch_dtype_round_trips(dtype):
    t = torch.arange(6 * dtype.itemsize, dtype=torch.uint8).view(dtype).reshape(2, -1)
    assert_same(t, round_trip(t))
    assert_same(t.t(), round_trip(t.t()))


@pytest.mark.filterwarnings("ignore:.*quantiz:UserWarning")
@pytest.mark.parametrize("dtype", sorted(QUANTIZED, key=str), ids=str)
def test_quantized_tensor_is_refused(dtype):
    t = torch.empty(4, dtype=dtype)
    with pytest.raises(UnsupportedValueError, match="register_codec"):
        encode_payload({"q": t})


def test_special_floats_keep_their_bits():
    nan_with_payload = struct.unpack("<d", b"\x01\x00\x00\x00\x00\x00\xf8\x7f")[0]
    value = [float("nan"), nan_with_payload, -0.0, math.inf, -math.inf]
    assert_same(value, round_trip(value))


def test_ints_of_any_size_round_trip():
    value = [0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 7**500, -(7**500)]
    assert_same(value, round_trip(value))


def test_dict_keeps_insertion_order_and_key_types():
    value = {"b": 1, 2: 2, 2.5: 3, None: 4, True: 5, b"k": 6, ("t", (1, None)): 7, "a": 8}
    decoded = round_trip(value)
    assert list(decoded) == list(value)
    assert_same(value, decoded)


def test_lone_surrogate_strings_round_trip():
    assert_same(["\ud800", {"\udfff": 1}], round_trip(["\ud800", {"\udfff": 1}]))


def test_conjugated_complex_tensor_round_trips_resolved():
    t = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64).conj()
    decoded = round_trip(t)
    assert not decoded.is_conj()
    assert torch.equal(decoded, torch.tensor([1 - 2j, 3 + 4j], dtype=torch.complex64))


def test_requires_grad_is_not_kept():
    t = torch.ones(3, requires_grad=True)
    decoded = round_trip(t)
    assert not decoded.requires_grad
    assert torch.equal(decoded, torch.ones(3))


def test_object_array_of_nested_values_round_trips():
    array = np.empty((2, 2), dtype=object)
    array[0, 0], array[0, 1] = "text", {"k": [1, None]}
    array[1, 0], array[1, 1] = np.arange(3), torch.zeros(2, dtype=torch.bfloat16)
    assert_same(array, round_trip(array))


@SETTINGS
@given(values)
def test_any_supported_value_decodes_the_same_from_a_buffer_handed_over(value):
    handed = owned_buffer(len(encoded := encode_payload(value)))
    handed[:] = encoded
    assert_same(value, decode_payload_releasing(handed, release=None, adopt=True))


# ---------------------------------------------------------------------------------------------
# Memory: decoded values own their bytes, unless their buffer was handed over


def test_tensors_and_arrays_decoded_from_a_buffer_handed_over_are_views_of_it():
    encoded = encode_payload({"t": torch.arange(1000, dtype=torch.int64), "a": np.arange(1000.0)})
    handed = owned_buffer(len(encoded))
    handed[:] = encoded
    decoded = decode_payload_releasing(handed, release=None, adopt=True)
    decoded["t"][0] = 7  # writable, and written into the buffer itself: nothing was copied
    decoded["a"][0] = 7.0
    start = np.frombuffer(handed, dtype=np.uint8).ctypes.data
    assert start <= decoded["t"].data_ptr() < decoded["a"].ctypes.data < start + len(handed)
    assert np.frombuffer(handed, dtype=np.int64, count=1, offset=decoded["t"].data_ptr() - start)[0] == 7
    del handed
    assert decoded["t"][:3].tolist() == [7, 1, 2]  # the buffer lives as long as a view of it


def test_a_read_only_buffer_is_never_adopted():
    with pytest.raises(TypeError, match="only a writable payload buffer can be adopted"):
        decode_payload_releasing(bytes(encode_payload({"t": torch.ones(2)})), release=None, adopt=True)




def test_decoded_tensors_and_arrays_do_not_share_memory_with_input():
    buffer = encode_payload({"t": torch.arange(1000, dtype=torch.int64), "a": np.arange(1000.0)})
    decoded = decode_payload(memoryview(buffer))
    buffer[:] = b"\xff" * len(buffer)
    assert torch.equal(decoded["t"], torch.arange(1000, dtype=torch.int64))
    assert np.array_equal(decoded["a"], np.arange(1000.0))


def test_decoding_leaves_no_reference_to_the_input_view():
    value = {"t": torch.ones(4), "a": np.ones(4), "s": np.float32(1), "o": np.array([1], dtype=object)}
    buffer = encode_payload(value)
    view = memoryview(buffer)
    decoded = decode_payload(view)
    view.release()  # raises BufferError if anything decoded still exports the buffer
    buffer.extend(b"x")  # as does resizing an exported bytearray
    assert torch.equal(decoded["t"], torch.ones(4))


def test_payload_starts_with_magic_and_aligns_data_to_64_bytes():
    payload = encode_payload({"x": torch.ones(3), "y": torch.ones(5, dtype=torch.float64)})
    assert bytes(payload[: len(PAYLOAD_MAGIC)]) == PAYLOAD_MAGIC
    (header_len,) = struct.unpack_from("<Q", payload, 8)
    header = msgpack.unpackb(bytes(payload[16 : 16 + header_len]))
    data_start = (16 + header_len + 63) // 64 * 64
    offsets = [node[3] for node in header[2::2]]
    assert all(offset % 64 == 0 for offset in offsets)
    assert len(payload) == data_start + offsets[-1] + 40


# ---------------------------------------------------------------------------------------------
# Refusals


def test_unsupported_value_error_names_its_path_and_register_codec():
    value = {"non_tensor_batch": {"reward_model": [1, 2, 3, object()]}}
    with pytest.raises(UnsupportedValueError) as info:
        encode_payload(value)
    message = str(info.value)
    assert "non_tensor_batch.reward_model[3]" in message
    assert "object" in message
    assert "stepjournal.payloads.register_codec(" in message


def test_unsupported_value_in_object_array_names_its_index():
    array = np.empty((2, 2), dtype=object)
    array[:] = 1
    array[1, 0] = object()
    with pytest.raises(UnsupportedValueError, match=r"batch\.obj\[1, 0\]"):
        encode_payload({"batch": {"obj": array}})


def test_unsupported_root_value_is_named_payload():
    with pytest.raises(UnsupportedValueError, match="<payload>"):
        encode_payload(object())


def test_unsupported_error_is_a_type_error():
    with pytest.raises(TypeError):
        encode_payload({1, 2})


@pytest.mark.parametrize(
    "value",
    [
        collections.OrderedDict(a=1),
        collections.namedtuple("Point", "x y")(1, 2),
        type("MyList", (list,), {})([1]),
        torch.nn.Parameter(torch.ones(2)),
        np.ma.masked_array([1, 2]),
        type("MyInt", (int,), {})(3),
        bytearray(b"x"),
    ],
    ids=["OrderedDict", "namedtuple", "list-subclass", "Parameter", "masked-array", "int-subclass", "bytearray"],
)
def test_subclasses_and_lookalikes_are_refused_not_downgraded(value):
    with pytest.raises(UnsupportedValueError, match="register_codec"):
        encode_payload({"v": value})


def test_unsupported_dict_key_is_refused_with_its_place():
    with pytest.raises(UnsupportedValueError, match=r"under outer"):
        encode_payload({"outer": {frozenset(): 1}})


def test_structured_numpy_array_is_refused():
    with pytest.raises(UnsupportedValueError, match="numpy dtype"):
        encode_payload(np.zeros(2, dtype=[("a", "i4")]))


def test_meta_tensor_is_refused():
    with pytest.raises(UnsupportedValueError, match="meta"):
        encode_payload(torch.empty(2, device="meta"))


def test_sparse_tensor_is_refused():
    with pytest.raises(UnsupportedValueError, match="dense"):
        encode_payload(torch.eye(2).to_sparse())


def test_reference_cycle_is_refused():
    value: list = [1]
    value.append({"back": value})
    with pytest.raises(UnsupportedValueError, match="cycle"):
        encode_payload(value)


def test_shared_references_are_stored_as_copies():
    shared = [1, 2]
    decoded = round_trip([shared, shared])
    assert decoded == [[1, 2], [1, 2]]
    assert decoded[0] is not decoded[1]


def test_nesting_deeper_than_the_limit_is_refused():
    value: list = []
    for _ in range(MAX_DEPTH + 5):
        value = [value]
    with pytest.raises(UnsupportedValueError, match="deeper"):
        encode_payload(value)


def test_nesting_at_the_limit_round_trips():
    value: list = [2**100, torch.ones(1), np.float32(1)]
    for _ in range(MAX_DEPTH - 1):
        value = [value]
    assert_same(value, round_trip(value))


# ---------------------------------------------------------------------------------------------
# Custom codecs


class Point:
    def __init__(self, x: torch.Tensor, label: str) -> None:
        self.x = x
        self.label = label


def point_registry() -> CodecRegistry:
    registry = CodecRegistry()
    registry.register(
        Point,
        "tests.Point",
        encode=lambda p: {"x": p.x, "label": p.label},
        decode=lambda d: Point(d["x"], d["label"]),
    )
    return registry


def test_registered_custom_type_round_trips():
    registry = point_registry()
    decoded = round_trip({"points": [Point(torch.arange(3.0), "a")]}, registry)
    point = decoded["points"][0]
    assert type(point) is Point
    assert point.label == "a"
    assert torch.equal(point.x, torch.arange(3.0))


def test_unknown_codec_name_on_decode_raises_unknown_codec_error():
    payload = encode_payload(Point(torch.ones(1), "a"), registry=point_registry())
    with pytest.raises(UnknownCodecError, match="tests.Point") as info:
        decode_payload(payload, registry=CodecRegistry())
    assert "register" in str(info.value)
    assert isinstance(info.value, PayloadDecodeError)


def test_failing_codec_decode_raises_payload_decode_error():
    registry = CodecRegistry()
    registry.register(Point, "tests.Point", encode=lambda p: p.label, decode=lambda d: Point(d["x"], d))
    payload = encode_payload(Point(torch.ones(1), "a"), registry=registry)
    with pytest.raises(PayloadDecodeError, match="tests.Point"):
        decode_payload(payload, registry=registry)


def test_reregistering_the_same_pair_is_a_no_op():
    registry = point_registry()
    registry.register(Point, "tests.Point", encode=lambda p: None, decode=lambda d: None)
    assert round_trip(Point(torch.ones(1), "kept"), registry).label == "kept"


def test_registering_a_taken_name_for_another_type_raises():
    registry = point_registry()
    with pytest.raises(ValueError, match="already registered"):
        registry.register(type("Other", (), {}), "tests.Point", encode=lambda v: 0, decode=lambda v: v)


def test_registering_a_second_name_for_a_type_raises():
    registry = point_registry()
    with pytest.raises(ValueError, match="already has a codec"):
        registry.register(Point, "tests.Point2", encode=lambda v: 0, decode=lambda v: v)


def test_registering_a_natively_stored_type_raises():
    with pytest.raises(ValueError, match="natively"):
        CodecRegistry().register(dict, "my.dict", encode=lambda v: v, decode=lambda v: v)


def test_registry_copy_is_independent():
    registry = point_registry()
    copy = registry.copy()
    Extra = type("Extra", (), {})
    copy.register(Extra, "tests.Extra", encode=lambda v: 0, decode=lambda v: Extra())
    assert "tests.Extra" in copy
    assert "tests.Extra" not in registry
    assert "tests.Point" in copy


def test_register_codec_uses_the_default_registry():
    DefaultThing = type("DefaultThing", (), {})
    register_codec(DefaultThing, "tests.DefaultThing", encode=lambda v: [1], decode=lambda v: DefaultThing())
    assert "tests.DefaultThing" in default_registry
    assert type(decode_payload(encode_payload(DefaultThing()))) is DefaultThing


def test_codec_that_returns_its_own_instance_is_refused_not_recursed():
    registry = CodecRegistry()
    Loop = type("Loop", (), {})
    registry.register(Loop, "tests.Loop", encode=lambda v: v, decode=lambda v: v)
    with pytest.raises(UnsupportedValueError, match="cycle"):
        encode_payload(Loop(), registry=registry)


# ---------------------------------------------------------------------------------------------
# describe_payload


def test_describe_payload_reports_structure_as_json():
    registry = point_registry()
    value = {
        "t": torch.zeros(2, 3, dtype=torch.bfloat16),
        "a": np.zeros(4, dtype=">i4"),
        "s": "x" * 200,
        "n": [3, None, float("nan")],
        "p": Point(torch.ones(1), "a"),
    }
    tree = describe_payload(encode_payload(value, registry=registry), registry=registry)
    json.dumps(tree, allow_nan=False)
    items = {item["key"]: item["value"] for item in tree["items"]}
    assert items["t"] == {"kind": "tensor", "dtype": "torch.bfloat16", "shape": [2, 3], "nbytes": 12}
    assert items["a"] == {"kind": "ndarray", "dtype": ">i4", "shape": [4], "nbytes": 16}
    assert items["s"]["length"] == 200 and len(items["s"]["value"]) == 80
    assert items["n"]["items"][0] == {"kind": "int", "value": 3}
    assert items["n"]["items"][2] == {"kind": "float", "value": "nan"}
    assert items["p"]["name"] == "tests.Point" and items["p"]["registered"]


def test_describe_payload_runs_no_codec_and_marks_unregistered_names():
    payload = encode_payload(Point(torch.ones(1), "a"), registry=point_registry())
    tree = describe_payload(payload, registry=CodecRegistry())
    assert tree["kind"] == "ext" and not tree["registered"]


def test_describe_payload_limits_items_per_container():
    tree = describe_payload(encode_payload(list(range(500))), max_items=10)
    assert tree["length"] == 500 and len(tree["items"]) == 10


def test_describe_payload_handles_ints_too_long_for_decimal_text():
    huge = 1 << 20000
    tree = describe_payload(encode_payload({huge: huge}))
    json.dumps(tree)
    assert tree["items"][0]["value"] == {"kind": "int", "bits": 20001, "hex": tree["items"][0]["value"]["hex"]}
    assert tree["items"][0]["value"]["hex"].startswith("0x1000")


# ---------------------------------------------------------------------------------------------
# Hostile input


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_payload_decode_error(data):
    decode_or_reject(data)


@FUZZ
@given(st.binary(max_size=300), st.binary(max_size=200))
def test_random_header_behind_a_valid_prefix_only_raises_payload_decode_error(header, data):
    decode_or_reject(frame(header, data))


header_trees = st.recursive(
    st.integers(-2, 12)
    | st.integers(-(2**63), 2**64 - 1)
    | st.text(max_size=12)
    | st.binary(max_size=12)
    | st.none()
    | st.floats()
    | st.sampled_from(["torch.float32", "torch.bfloat16", "<f8", "|b1", "<U3", "O", "tests.Point"]),
    lambda inner: st.lists(inner, max_size=6),
    max_leaves=30,
)


@FUZZ
@given(header_trees, st.binary(max_size=200))
def test_random_node_trees_only_raise_payload_decode_error(tree, data):
    decode_or_reject(frame(msgpack.packb(tree), data))
    try:
        describe_payload(frame(msgpack.packb(tree), data))
    except PayloadDecodeError:
        pass


field_values = st.one_of(
    st.integers(-1, 300),
    st.sampled_from([2**31, 2**62, 2**63 - 1, 2**64 - 1]),
    st.lists(st.integers(0, 2**64 - 1), max_size=4),
    st.lists(st.integers(0, 5), max_size=4),
    st.sampled_from(["torch.float32", "torch.bool", "torch.float8_e4m3fn", "<f8", ">i2", "|b1", "<U3", "|S2"]),
    st.sampled_from(["<M8", "<M8[ns]", "O", "x"]),
    st.binary(max_size=16),
    st.none(),
)


@FUZZ
@given(st.sampled_from([2, 3, 4, 5, 6, 7, 8]), st.lists(field_values, max_size=5), st.binary(max_size=300))
def test_nodes_with_random_fields_only_raise_payload_decode_error(tag, fields, data):
    """Tensor, array, scalar and codec nodes whose lengths, shapes and dtypes may all lie."""
    payload = frame(msgpack.packb([tag, *fields]), data)
    decode_or_reject(payload)
    try:
        describe_payload(payload)
    except PayloadDecodeError:
        pass


SAMPLE = encode_payload(
    {
        "t": torch.arange(6, dtype=torch.float32).reshape(2, 3),
        "a": np.arange(4, dtype=">i2"),
        "o": np.array(["x", None], dtype=object),
        "n": [1, 2**70, (b"b", 2.5)],
        "s": np.int64(3),
    }
)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(SAMPLE) - 1), st.integers(0, 255)), min_size=1, max_size=6))
def test_valid_payload_with_flipped_bytes_only_raises_payload_decode_error(flips):
    data = bytearray(SAMPLE)
    for index, byte in flips:
        data[index] = byte
    decode_or_reject(bytes(data))


@FUZZ
@given(st.integers(0, len(SAMPLE) - 1))
def test_truncated_payload_only_raises_payload_decode_error(length):
    with pytest.raises(PayloadDecodeError):
        decode_payload(SAMPLE[:length])


def test_tensor_claiming_2_to_60_bytes_is_refused_before_allocating():
    header = msgpack.packb([4, "torch.uint8", [2**30, 2**30], 0, 2**60])
    start = time.perf_counter()
    with pytest.raises(PayloadDecodeError, match="outside the data section"):
        decode_payload(frame(header, b"\0" * 64))
    assert time.perf_counter() - start < 1.0


def test_shape_that_does_not_match_nbytes_is_refused():
    header = msgpack.packb([4, "torch.float32", [3], 0, 8])
    with pytest.raises(PayloadDecodeError, match="do not hold"):
        decode_payload(frame(header, b"\0" * 64))


def test_two_nodes_sharing_one_buffer_are_refused():
    # Without this check a small payload could name one big buffer many times and multiply memory.
    node = [4, "torch.uint8", [64], 0, 64]
    with pytest.raises(PayloadDecodeError, match="overlaps"):
        decode_payload(frame(msgpack.packb([0, node, node]), b"\0" * 64))


@pytest.mark.parametrize("name", ["torch.nonexistent", "__class__", "float32", "torch.qint8"])
def test_unknown_torch_dtype_name_is_refused(name):
    with pytest.raises(PayloadDecodeError, match="unknown dtype"):
        decode_payload(frame(msgpack.packb([4, name, [1], 0, 1]), b"\0" * 64))


@pytest.mark.parametrize("name", ["O", "|O", "<i4,<i4", "V8", "|V8", "=i4", "<U0"])
def test_numpy_dtype_outside_the_allow_list_is_refused(name):
    with pytest.raises(PayloadDecodeError, match="unknown dtype"):
        decode_payload(frame(msgpack.packb([5, name, [1], 0, 4]), b"\0" * 64))


def test_header_nested_deeper_than_the_limit_is_refused():
    tree: list = [0]
    for _ in range(MAX_DEPTH + 10):
        tree = [0, tree]
    with pytest.raises(PayloadDecodeError, match="deeper"):
        decode_payload(frame(msgpack.packb(tree)))


def test_empty_array_with_sizes_multiplying_past_2_to_63_is_refused():
    with pytest.raises(PayloadDecodeError, match="too large"):
        decode_payload(frame(msgpack.packb([5, "<f8", [0, 2**62], 0, 0])))


def test_unknown_node_kind_is_refused():
    with pytest.raises(PayloadDecodeError, match="unknown node kind 99"):
        decode_payload(frame(msgpack.packb([99, 1])))


def test_header_length_longer_than_the_data_is_refused():
    data = bytearray(encode_payload([1, 2]))
    struct.pack_into("<Q", data, 8, 2**62)
    with pytest.raises(PayloadDecodeError, match="header claims"):
        decode_payload(data)


def test_newer_format_version_is_refused_with_a_hint():
    data = bytearray(encode_payload([1, 2]))
    data[4] = 2
    with pytest.raises(PayloadDecodeError, match="version 2"):
        decode_payload(data)


def test_msgpack_map_or_timestamp_in_header_is_refused():
    for header in (msgpack.packb({"a": 1}), msgpack.packb(msgpack.Timestamp(1))):
        with pytest.raises(PayloadDecodeError):
            decode_payload(frame(header))


def test_object_array_with_fewer_items_than_its_shape_is_refused():
    with pytest.raises(PayloadDecodeError, match="holds 1 items"):
        decode_payload(frame(msgpack.packb([6, [2**40], 1])))
