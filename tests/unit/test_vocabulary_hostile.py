"""Absurd words through the public API: every one refused with a typed error naming it and what to use, and
nothing refused is ever half-written (an event the journal accepted is one it can read back)."""

from __future__ import annotations

import pytest

from stepjournal import Journal
from stepjournal.errors import InvalidKeyError

HUGE = 2_000_000  # characters: an event body is at most 1 MiB


@pytest.mark.parametrize("field", ["policy", "reason"])
def test_a_text_field_too_large_for_an_event_is_refused_before_anything_is_written(tmp_path, field):
    """Before, a policy or reason of 2 MB was recorded and acknowledged, and then the journal could not read
    its own event: verify reported it as damage and the step's lookup failed."""
    with Journal(tmp_path / "j") as journal:
        journal.record(0, {"a": 0})
        with pytest.raises(InvalidKeyError) as refused:
            journal.record(1, {"a": 1}, **{field: "p" * HUGE})
        message = str(refused.value)
        assert field in message and "1048576" in message and len(message) < 400
        journal.record(2, {"a": 2})
        assert journal.recorded_steps() == [0, 2] and journal.verify() == []
        assert journal.load_output(journal.lookup(2)) == {"a": 2}


@pytest.mark.parametrize("words, named", [
    ({"stage": ""}, "stage ''"), ({"stage": "a\x00b"}, "stage 'a\\x00b'"), ({"stage": 5}, "stage 5"),
    ({"stage": b"generate"}, "stage b'generate'"), ({"stage": "\udc80"}, "lone surrogate"),
    ({"stage": "s" * HUGE}, "use a shorter stage"), ({"mode": None}, "mode None"),
    ({"step": -1}, "step -1"), ({"step": 2**64}, "step 18446744073709551616"), ({"step": True}, "step True"),
    ({"step": 1.0}, "step 1.0"), ({"gen_index": 2**64}, "gen_index 18446744073709551616"),
    ({"policy": 3}, "policy=3"), ({"duration_s": float("nan")}, "duration_s=nan"),
])
def test_an_absurd_word_is_refused_with_its_name_and_what_to_use(tmp_path, words, named):
    words = {"step": 1, **words}
    with Journal(tmp_path / "j") as journal:
        with pytest.raises(InvalidKeyError) as refused:
            journal.record(words.pop("step"), {"a": 1}, **words)
        assert named in str(refused.value) and len(str(refused.value)) < 400
        assert journal.recorded_steps() == [] and journal.verify() == []


def test_a_mode_too_long_for_a_key_is_named_as_the_mode(tmp_path):
    """The key's size error names the word that is long (before, a long mode was told to shorten its run key)."""
    with Journal(tmp_path / "j") as journal:
        with pytest.raises(InvalidKeyError, match="mode") as refused:
            journal.record(1, {"a": 1}, mode="m" * 600)
        assert "mode 'mmmm" in str(refused.value)
