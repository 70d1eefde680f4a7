"""``stepjournal.errors``: every error (and warning) stepjournal raises on purpose, under one base class.

Each class prints under this module (``stepjournal.errors.SpecError``), whichever room raised it, and this is
the one public place to import them from (``stepjournal.JournalError`` is no longer offered; the policy engine's
own errors are also offered by ``stepjournal.policies``). docs/errors.md lists them with what each says to do next.
"""

from __future__ import annotations

from .base._errors import *  # noqa: F401,F403  (each error class, once)
from .base._errors import __all__ as __all__  # the one list of them
