"""Each public face names its names once: `__all__` is its `if TYPE_CHECKING:` block, and each resolves lazily."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from stepjournal.base._face import face_imports  # private: the face reader under test

FACES = ["stepjournal", "stepjournal.base", "stepjournal.events", "stepjournal.index", "stepjournal.payloads",
         "stepjournal.tools",
         "stepjournal.sharing", "stepjournal.upkeep"]


@pytest.mark.parametrize("name", FACES)
def test_a_faces_all_is_its_type_checking_block_and_each_name_resolves(name):
    face = importlib.import_module(name)
    block = face_imports(Path(face.__file__).read_text(encoding="utf-8"))
    assert sorted(set(face.__all__) - {"__version__"}) == sorted(block)
    assert len(set(face.__all__)) == len(face.__all__)
    for public in face.__all__:
        assert getattr(face, public) is not None
        assert public in dir(face)


def test_an_unknown_name_is_an_attribute_error_naming_the_face():
    import stepjournal.sharing

    with pytest.raises(AttributeError, match="'stepjournal.sharing' has no attribute 'prune'"):
        stepjournal.sharing.prune  # noqa: B018  (the read is the test)


def test_the_top_level_keeps_what_users_call_and_offers_no_error():
    import stepjournal

    assert {"Journal", "DEFAULT_RUN", "journaled", "Sample", "diff_journals"} <= set(stepjournal.__all__)
    assert not hasattr(stepjournal, "JournalError") and not hasattr(stepjournal, "push")
    assert len(stepjournal.__all__) <= 25


def test_the_face_reader_finds_the_names_of_a_planted_block():
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._a import x, y as z\n"
              "    from ..b._c import W\nimport os\n")
    assert face_imports(source) == {"x": ("._a", "x"), "z": ("._a", "y"), "W": ("..b._c", "W")}
