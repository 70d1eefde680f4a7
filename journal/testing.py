"""``stepjournal.testing``: the conformance suite a payload store passes, for a third party's store too.

`PayloadStoreConformance` is a plain class whose ``test_*`` methods each take a fresh folder (``tmp_path``):
subclass it as ``TestMyStore`` and pytest runs it with its own ``tmp_path`` fixture, or call
`run_conformance` on an instance, without pytest (pytest is no dependency of stepjournal); it runs a policy's
suite too. A policy's
suite, and an in-memory journal view for pure policy tests, are in ``stepjournal.policies.testing``
(the policies sit above the journal). docs/journal.md, "Writing a payload store", shows both ways.
"""

from .base._suites import run_conformance
from .payloads._store_suite import PayloadStoreConformance, payload_of, raises

__all__ = ["PayloadStoreConformance", "payload_of", "raises", "run_conformance"]
