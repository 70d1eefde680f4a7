"""A multi-turn sample read as its turns: where a generate call marks the tokens tools wrote (verl's
`response_mask` in a padded batch, verl V1's jagged rows, TRL's `tool_mask`), `Sample.turns` holds the model's
runs of tokens between them, and `show STEP --text --sample S`, typed in bash, prints each turn's assistant text
above the tool calls the turn made."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from stepjournal import Journal
from stepjournal.adapters import journaled_tool, tool_turn
from test_samples import PAD, VOCAB, ids, tokenizer_dir  # noqa: F401  (tokenizer_dir: the fixture)


def turns_of(payload: dict) -> list:
    return [sample.turns for sample in _recorded(payload)]


def _recorded(payload: dict) -> list:
    import tempfile

    with tempfile.TemporaryDirectory() as folder, Journal(os.path.join(folder, "j")) as journal:
        journal.record(1, payload)
        return journal.samples(1)


def test_a_padded_verl_batch_splits_at_the_response_mask_and_leaves_the_padding_out():
    prompts = torch.tensor([[PAD, 2], [2, 3]])
    responses = torch.tensor([[4, 5, 9, 9, 6, PAD], [4, 5, 6, PAD, PAD, PAD]])
    attention = torch.tensor([[0, 1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0, 0]])
    response_mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 1, 0, 0, 0]])
    assert turns_of({"prompts": prompts, "responses": responses, "attention_mask": attention,
                     "response_mask": response_mask}) == [((4, 5), (6,)), ((4, 5, 6),)]


def test_trl_tool_mask_splits_each_completion():
    assert turns_of({"completion_ids": [[4, 5, 9, 6, 9, 7], [4]], "tool_mask": [[1, 1, 0, 1, 0, 1], [1]]}) == [
        ((4, 5), (6,), (7,)), ((4,),)]


def test_verl_v1_jagged_rows_split_at_their_own_mask():
    """V1's TQBatch (the real class and codec), whose rows are jagged: no padding, a mask row per response row."""
    from tensordict import TensorDict

    from stepjournal.adapters.verl.v1._codec import TQBatch, register_tq_codec  # private: V1's batch and its codec

    register_tq_codec()
    jagged = lambda rows: torch.nested.nested_tensor([torch.tensor(r) for r in rows], layout=torch.jagged)  # noqa: E731
    fields = TensorDict({"prompts": jagged([[2], [3]]), "responses": jagged([[4, 9, 5], [6]]),
                         "response_mask": jagged([[1, 0, 1], [1]])}, batch_size=[2])
    assert turns_of(TQBatch(fields, keys=("u0", "u1"), tags=({}, {}))) == [((4,), (5,)), ((6,),)]


@pytest.mark.parametrize("payload", [
    {"completion_ids": [[4, 5], [6]]},  # no mask: nothing to split by
    {"completion_ids": [[4, 5], [6]], "tool_mask": [[1, 1], [1]]},  # no tool wrote a token
    {"completion_ids": [[4, 5], [6]], "tool_mask": [[1], [1]]},  # not one mark per token
])
def test_a_response_without_tool_tokens_has_no_turns(payload):
    assert turns_of(payload) == [(), ()]


def test_show_text_sample_prints_each_turns_assistant_text_above_its_calls(tmp_path, tokenizer_dir):  # noqa: F811
    path = str(tmp_path / "agent")

    def calculator(expression: str) -> str:
        return "four"

    with Journal(path, run="agent", fingerprint={"tokenizer": tokenizer_dir}) as journal:
        tool = journaled_tool(calculator, journal, "calculator", "cache")
        with tool_turn(step=1, sample=1, turn=0):
            tool(expression="2+2")
        response = ids("what is two plus two four the cat sat")
        marks = [1, 1, 1, 1, 1, 0, 1, 1, 1]  # "four" is the tool's
        journal.record(1, {"completion_ids": [ids("a"), response[:4] + response[5:]],
                           "tool_mask": [[1], marks[:4] + marks[5:]]})
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ['PATH']}", "J": path}
    done = subprocess.run(["bash", "-c", 'stepjournal show "$J" 1 --text --sample 1'], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == [
        "  turn 0", "    assistant: what is two plus", '    calculator({"expression":"2+2"})  miss', "      → four",
        "  turn 1", "    assistant: the cat sat"]
