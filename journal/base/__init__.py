"""The journal's base: typed errors, logging, paths, secrets, digests, the memory behind a payload view,
progress, the version; imports nothing else of the journal.

Public here: where a journal's path comes from and the on-disk format's version. The errors are public in
`stepjournal.errors`.
"""

from typing import TYPE_CHECKING

from ._face import lazy_face

if TYPE_CHECKING:
    from ._paths import resolve_journal_path
    from ._version import JOURNAL_FORMAT

__all__ = ["resolve_journal_path", "JOURNAL_FORMAT"]

__getattr__, __dir__ = lazy_face(globals())
