"""The ``verl.DataProto`` codec: exact round trips (tensors bit-equal, same keys, same object arrays,
same meta_info), including through record -> replay in a new process."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from tensordict import NonTensorData, NonTensorStack, TensorDict
from verl.protocol import DataProto

from stepjournal import Journal
from stepjournal.errors import PayloadDecodeError, UnknownCodecError, UnsupportedValueError
from stepjournal.payloads import CodecRegistry, decode_payload, encode_payload
from stepjournal.adapters.verl import dataproto_diff, decode_dataproto
from stepjournal.policies import Engine, parse

from verl_support import realistic_dataproto
from reliability_support import worker_context


def round_trip(data: DataProto) -> DataProto:
    return decode_payload(encode_payload(data))


def _replay_in_child(path: str, queue) -> None:
    """Spawned child: replay step 3 with a generator that must not run, and compare with the original."""
    import stepjournal.adapters.verl  # noqa: F401  registers the codec in this process

    from verl_support import realistic_dataproto as build

    with Journal(path, run="r") as journal:
        engine = Engine(journal, parse("replay"))

        def must_not_run():
            raise AssertionError("replay generated")

        outcome = engine.call(3, must_not_run)
        inputs = journal.load_input(outcome.source)
        queue.put((type(outcome.value).__module__, type(outcome.value).__name__, outcome.action,
                   dataproto_diff(outcome.value, build(rows=8, seed=5)), dataproto_diff(inputs, build(rows=4, seed=6))))


def test_a_realistic_dataproto_replays_identically_in_a_new_process(tmp_path):
    path = str(tmp_path / "journal")
    with Journal(path, run="r") as journal:
        Engine(journal, parse("dump")).call(3, lambda: realistic_dataproto(rows=8, seed=5),
                                           input=realistic_dataproto(rows=4, seed=6))
    ctx = worker_context()
    queue = ctx.Queue()
    child = ctx.Process(target=_replay_in_child, args=(path, queue))
    child.start()
    module, name, action, out_diff, in_diff = queue.get(timeout=300)
    child.join(60)
    assert (module, name, action) == ("verl.protocol", "DataProto", "replayed")
    assert out_diff == [] and in_diff == []


def test_the_realistic_dataproto_keeps_every_detail():
    data = realistic_dataproto()
    back = round_trip(data)
    assert dataproto_diff(data, back) == []
    assert back.batch["old_log_probs"].dtype == torch.bfloat16
    assert list(back.batch.keys()) == list(data.batch.keys())
    assert back.batch.batch_size == data.batch.batch_size
    assert torch.isnan(back.batch["rm_scores"][0, 0]) and torch.signbit(back.batch["rm_scores"][0, 1])
    assert back.non_tensor_batch["reward_model"][3] == data.non_tensor_batch["reward_model"][3]
    assert back.non_tensor_batch["__num_turns__"].dtype == np.int32
    assert back.meta_info["nested"]["a"] == (1, "b") and type(back.meta_info["timing"]["agent_loop/slowest/num_preempted"]) is np.int64


def test_nested_tensordicts_jagged_tensors_and_non_tensor_data_round_trip():
    rows = 3
    batch = TensorDict({
        "ids": torch.arange(rows * 2).reshape(rows, 2),
        "sub": TensorDict({"lp": torch.randn(rows, 4).to(torch.float16)}, batch_size=[rows]),
        "jagged": torch.nested.nested_tensor([torch.arange(i + 1) for i in range(rows)], layout=torch.jagged),
    }, batch_size=[rows], device="cpu")
    batch.set("tag", NonTensorData("gsm8k", batch_size=[rows]))
    data = DataProto(batch=batch, non_tensor_batch={}, meta_info={})
    back = round_trip(data)
    assert dataproto_diff(data, back) == []
    assert back.batch.device == torch.device("cpu")
    assert back.batch["jagged"].is_nested


def test_a_dataproto_without_tensors_round_trips():
    data = DataProto(batch=None, non_tensor_batch={"raw_prompt": np.array([[{"role": "user", "content": "hi"}]], dtype=object)},
                     meta_info={"validate": True})
    assert dataproto_diff(data, round_trip(data)) == []


def test_a_change_of_one_bit_is_a_difference():
    data = realistic_dataproto()
    back = round_trip(data)
    back.batch["rollout_log_probs"].view(torch.int32)[0, 0] ^= 1
    back.non_tensor_batch["reward_model"][0]["ground_truth"] = "x"
    back.meta_info["temperature"] = 0.7
    diff = dataproto_diff(data, back)
    assert len(diff) == 3 and "rollout_log_probs" in diff[0]


def test_a_non_tensor_stack_in_the_batch_is_refused_with_advice():
    batch = TensorDict({"ids": torch.zeros(2, 1)}, batch_size=[2])
    batch.set("texts", NonTensorStack(NonTensorData("a"), NonTensorData("b")))
    with pytest.raises(UnsupportedValueError, match="non_tensor_batch"):
        encode_payload(DataProto(batch=batch))


def test_a_newer_schema_asks_for_an_upgrade():
    with pytest.raises(PayloadDecodeError, match="upgrade stepjournal"):
        decode_dataproto({"v": 99})


def test_reading_without_the_adapter_imported_loads_its_codec_plugin(tmp_path):
    path = str(tmp_path / "journal")
    with Journal(path, run="r") as journal:
        journal.record(1, realistic_dataproto(rows=2))
    code = (
        "import stepjournal, sys\n"
        f"j = stepjournal.Journal({path!r}, readonly=True, run='r')\n"
        "assert 'stepjournal.adapters.verl' not in sys.modules\n"
        "print(type(j.load_output(j.lookup(1))).__name__)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "DataProto"


def test_reading_through_a_registry_without_autoload_names_the_codec(tmp_path):
    path = str(tmp_path / "journal")
    with Journal(path, run="r") as journal:
        journal.record(1, realistic_dataproto(rows=2))
    with Journal(path, readonly=True, run="r", registry=CodecRegistry(autoload=False)) as journal:
        with pytest.raises(UnknownCodecError, match="'verl.DataProto'") as info:
            journal.load_output(journal.lookup(1))
    assert "import the adapter" in str(info.value)


# -- property: any DataProto of supported parts round-trips exactly ------------------------------------------

_DTYPES = [torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool, torch.float32, torch.float16,
           torch.bfloat16, torch.float64, torch.float8_e4m3fn]
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True),
                     st.text(max_size=12))
_values = st.recursive(_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)), max_leaves=8)


@st.composite
def dataprotos(draw):
    rows = draw(st.integers(1, 4))
    fields = {}
    for i, dtype in enumerate(draw(st.lists(st.sampled_from(_DTYPES), max_size=4))):
        width = draw(st.integers(0, 3))
        raw = draw(st.binary(min_size=rows * width * dtype.itemsize, max_size=rows * width * dtype.itemsize))
        tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        if dtype == torch.bool:
            tensor = tensor % 2
        fields[f"t{i}"] = tensor.view(dtype).reshape(rows, width)
    batch = TensorDict(fields, batch_size=[rows]) if fields or draw(st.booleans()) else None
    non_tensor = {}
    for key in draw(st.lists(st.text(min_size=1, max_size=5), max_size=3, unique=True)):
        items = draw(st.lists(_values, min_size=rows, max_size=rows))
        array = np.empty(rows, dtype=object)
        for i, item in enumerate(items):
            array[i] = item
        non_tensor[key] = array
    meta = draw(st.dictionaries(st.text(max_size=6), _values, max_size=4))
    return DataProto(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)


@given(dataprotos())
def test_any_dataproto_round_trips_exactly(data):
    assert dataproto_diff(data, round_trip(data)) == []
