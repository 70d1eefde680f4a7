"""The library version, in one place (pyproject reads it too), and the journal's on-disk format.

`JOURNAL_FORMAT` is the format of what a journal holds on disk, apart from the package version: it is
raised when a journal written by this library would be misread by a library of the format before,
or damaged if that library wrote to it. A journal stores its format in its ``meta`` database; an open
reads it (`storage._format`).
"""

__version__ = "0.1.0"
JOURNAL_FORMAT = 1
