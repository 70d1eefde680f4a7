"""A retention error carries its meaning as data: the argument at fault, its value, and the message's parts with
the arguments it names, so the command line words it with its flags without rewriting the text."""

from __future__ import annotations

from pathlib import PurePosixPath

import pytest

from stepjournal.adapters.cli._render import error_line  # private: the CLI's wording of an error
from stepjournal.errors import JournalError, PayloadStoreError, RetentionError
from stepjournal.upkeep import Retention


def test_a_size_that_is_not_one_names_the_argument_and_value_as_fields():
    with pytest.raises(RetentionError) as info:
        Retention(keep_last=1, max_bytes="10X")
    assert (info.value.option, info.value.value) == ("max_bytes", "10X")
    assert str(info.value) == "max_bytes='10X' is not a size: use a byte count like 4096, 512M or 10G"


def test_the_same_error_is_worded_with_a_callers_own_names():
    with pytest.raises(RetentionError) as info:
        Retention(keep_last=-1)
    flags = {"keep_last": "--keep-last"}
    text = info.value.words(lambda name, value: f"{flags[name]} {value}")
    assert text == "--keep-last -1 is not valid: use a whole number of steps (0 or more) or None"
    assert str(info.value).startswith("keep_last=-1 is not valid")


def test_a_long_value_is_clipped_in_the_message_and_kept_whole_in_the_field():
    huge = "9" * 5000
    with pytest.raises(RetentionError) as info:
        Retention(keep_last=1, max_bytes=huge)
    assert info.value.value == huge and "(5002 characters)" in str(info.value) and len(str(info.value)) < 500


def test_an_error_of_plain_text_reads_as_its_text_in_any_words():
    error = RetentionError("nothing to keep")
    assert str(error) == error.words(lambda name, value: "?") == "nothing to keep"
    assert error.option is None and error.value is None and error.rule is None


def test_a_journal_error_names_its_arguments_as_data_that_a_caller_words_its_own_way():
    error = JournalError("open the journal with ", ("readonly", True), " to read it")
    assert str(error) == "open the journal with readonly=True to read it"
    assert error.words(lambda name, value: "a reading command") == "open the journal with a reading command to read it"
    assert error.parts[1] == ("readonly", True)


def test_the_command_line_words_a_journal_error_from_its_parts():
    """`error_line` spells the arguments by the command line's words: a folder as itself, not path='...'."""
    error = JournalError("give a new folder, e.g. ", ("path", "/x/stepjournal"), "; or ", ("max_bytes", "10G"))
    assert error_line(error) == "give a new folder, e.g. /x/stepjournal; or --max-bytes '10G'"


def test_a_journal_error_given_a_message_that_is_not_text_keeps_it_as_its_text():
    """Made the old way, ``raise PayloadStoreError(exc)`` (a store of a third party): the message is the value's text,
    not a TypeError from reading it as an argument."""
    error = PayloadStoreError(OSError(28, "No space left on device"))
    assert str(error) == "[Errno 28] No space left on device" == error_line(error)
    assert str(JournalError("the folder ", PurePosixPath("/x"), " is full")) == "the folder /x is full"


class _StoreFull(PayloadStoreError):
    """A third party's error made the way errors were before parts: its own ``__init__``, not JournalError's."""

    def __init__(self, message: str, free: int) -> None:
        Exception.__init__(self, message)
        self.free = free


def test_the_command_line_prints_a_journal_error_whose_subclass_skips_journal_errors_init():
    error = _StoreFull("bucket full\nfree some space first", free=0)
    assert error.words(lambda name, value: name) == str(error)
    assert error_line(error) == "bucket full free some space first"  # before: AttributeError, a traceback
