"""``stepjournal.policies.testing``: the conformance suite a policy passes, and an in-memory journal for pure tests.

`PolicyConformance` checks what every policy promises (a named, pure, deterministic decision of a declared type;
a bad config refused with a typed error); `MemoryJournal` and `memory_view` give a policy the real `JournalView`
over events kept in memory, so a test of a decision needs no LMDB. Neither needs pytest:
`stepjournal.testing.run_conformance` runs the suite without it. The payload stores' suite is `stepjournal.testing`.
docs/plugins.md, "Test it with the shipped suite", shows both.
"""

from ._memory_journal import MemoryJournal, memory_view
from ._policy_suite import PolicyConformance

__all__ = ["MemoryJournal", "PolicyConformance", "memory_view"]
