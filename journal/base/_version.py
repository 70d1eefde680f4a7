"""The library version, in one place (pyproject reads it too), and the journal's on-disk format.

`__version__` names the package; it says nothing of what is on disk. Each on-disk format has its own
version, raised when a reader of the version before would misread it, and checked on open by a typed
error that names the version found, the version this library reads and what to do:

- `JOURNAL_FORMAT` (here): the journal as a whole, in its ``meta`` database (``format``, ``read_format``);
  checked by `storage._format.check_format_in` (`JournalFormatError`).
- ``events._keys.LAYOUT_VERSION``: the key layout of the ``gen`` and ``steps`` indexes (``meta`` ``layout``);
  `Projections.check_layout_in` (`UnsupportedSchemaVersionError`); layout 1 is rebuilt by a writable open.
- ``events._events.EVENT_TYPES``: each event type's schema version, in every stored event (``v``);
  `events._convert.decode_event` (`UnsupportedSchemaVersionError`); older ones are lifted (`_UPGRADES`).
- ``payloads._codec_format.FORMAT_VERSION``: a payload's bytes (`PayloadDecodeError`).
- ``sharing._remote_layout.REMOTE_FORMAT``: a remote's objects (`RemoteFormatError`).
- ``index._rows_index.ROWS_FORMAT``: the stored audit rows, rebuilt when it differs (a projection).
- ``tools._export.EXPORT_FORMAT_VERSION``, ``tools._diff_report.DIFF_SCHEMA_VERSION`` and
  ``events._events.AUDIT_SCHEMA_VERSION``: what the library writes for others to read (files, JSON).

tests/unit/test_format_versions.py refuses each newer version; CHANGELOG.md says which release changed which.
"""

__version__ = "0.1.0"
JOURNAL_FORMAT = 1
