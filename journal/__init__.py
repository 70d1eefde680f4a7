"""stepjournal: record, replay and audit the rollouts of RL training, in an append-only LMDB journal.

The top-level package holds what a user calls: `Journal`, the default run's name, `journaled`, a step's
`Sample` and `diff_journals`. The rest sits behind public subpackages, each with its own ``__all__``:
`stepjournal.errors` (every error), `stepjournal.events` (the events and the tool-call types),
`stepjournal.index` (audit rows and run summaries), `stepjournal.tools` (diff, compare, export, tool-call
rows, and the read-side helpers), `stepjournal.vocabulary` (the words every room shares),
`stepjournal.payloads` (codecs and stores),
`stepjournal.sharing` (push, pull, clone, bundles, remotes), `stepjournal.upkeep` (retention, prune,
compact, verify) and `stepjournal.base` (paths and the format version). Policies live in
`stepjournal.policies` and the adapters for verl, TRL and raw loops in `stepjournal.adapters`.
docs/architecture.md ("The public face") says why each name sits where it does.
"""

from typing import TYPE_CHECKING

from .base._face import lazy_face
from .base._version import __version__

# Names are imported on first use (PEP 562), so `import stepjournal` stays light: the command
# line's --help and --version, and a verb that reads only events, never load torch or numpy.
if TYPE_CHECKING:
    # `journaled` lives with the adapters (adapters -> policies -> journal); it is offered here because
    # wrapping a function is the first thing most users do.
    from stepjournal.adapters import journaled

    from ._journal import DEFAULT_RUN, Journal
    from .index._samples import Sample
    from .tools._diff import diff_journals

__all__ = [
    "__version__",
    "DEFAULT_RUN",
    "Journal",
    "Sample",
    "diff_journals",
    "journaled",
]

__getattr__, __dir__ = lazy_face(globals())
