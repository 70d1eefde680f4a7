"""The lazy faces under the ways a user reaches for names: a name that is not there says where to look, and
``dir``, ``import *`` and ``help`` see exactly the public names."""

from __future__ import annotations

import importlib
import pydoc

import pytest

FACES = ["stepjournal", "stepjournal.tools", "stepjournal.sharing", "stepjournal.upkeep", "stepjournal.payloads"]


@pytest.mark.parametrize("name", FACES)
def test_a_name_that_is_not_there_is_named_with_where_the_public_names_and_errors_are(name):
    face = importlib.import_module(name)
    with pytest.raises(AttributeError) as missing:
        face.JournalError  # noqa: B018  (the read is the test)
    message = str(missing.value)
    assert f"module {name!r} has no attribute 'JournalError'" in message
    assert f"{name}.__all__" in message and "stepjournal.errors" in message
    assert missing.value.name == "JournalError" and missing.value.obj is face  # Python's "Did you mean" reads these


def test_a_misspelt_name_gets_pythons_suggestion_from_the_faces_names():
    import stepjournal.tools

    with pytest.raises(AttributeError) as missing:
        stepjournal.tools.diff_journal  # noqa: B018  (the read is the test)
    assert missing.value.name == "diff_journal" and "diff_journals" in dir(stepjournal.tools)


def test_star_import_dir_and_help_see_every_public_name_of_the_tools_face():
    namespace: dict = {}
    exec("from stepjournal.tools import *", namespace)  # noqa: S102  (the statement under test, fixed text)
    import stepjournal.tools

    assert sorted(set(namespace) - {"__builtins__"}) == sorted(stepjournal.tools.__all__)
    assert set(stepjournal.tools.__all__) <= set(dir(stepjournal.tools))
    text = pydoc.render_doc(stepjournal.tools, renderer=pydoc.plaintext)
    assert "diff_journals" in text and "Tolerances" in text


def test_from_a_face_import_a_missing_name_is_an_import_error_naming_it():
    with pytest.raises(ImportError, match="cannot import name 'nope' from 'stepjournal.tools'"):
        exec("from stepjournal.tools import nope")  # noqa: S102  (the statement under test, fixed text)
