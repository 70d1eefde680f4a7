"""``stepjournal.errors``: every error (and warning) stepjournal raises on purpose, under one base class.

Each class prints under this module (``stepjournal.errors.SpecError``), whichever room raised it; the
names also stay where they were offered before (``stepjournal.SpecError`` is not one; ``stepjournal.JournalError``,
``stepjournal.policies.SpecError`` are). docs/errors.md lists them with what each says to do next.
"""

from __future__ import annotations

from .base._errors import *  # noqa: F401,F403  (each error class, once)
from .base._errors import __all__  # the one list of them
