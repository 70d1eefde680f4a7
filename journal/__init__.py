"""stepjournal: record, replay and audit the rollouts of RL training, in an append-only LMDB journal.

The top-level package holds what a user calls: `Journal`, the default run's name, `journaled`, a step's
`Sample` and `diff_journals`. The rest sits behind public subpackages, each with its own ``__all__``:
`stepjournal.errors` (every error), `stepjournal.events` (the events and the tool-call types),
`stepjournal.index` (audit rows and run summaries), `stepjournal.payloads` (codecs and stores),
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

    # The read-side tools' names stay here until `stepjournal.tools` is their public namespace, then they
    # move there.
    from .tools._compare import Comparison, Difference, compare_values
    from .tools._diff_report import DIFF_SCHEMA_VERSION, DiffReport, DiffSide, PairDiff
    from .tools._export import EXPORT_FORMAT_VERSION, OpaqueReader, OpaqueValue, export_payloads
    from .tools._tolerance import DTYPE_TOLERANCES, Tolerance, Tolerances
    from .tools._tool_rows import (ToolCallRow, ToolStepSummary, first_tool_difference, tool_call_rows,
                                   tool_step_summaries)

__all__ = [
    "__version__",
    "DEFAULT_RUN",
    "Journal",
    "Sample",
    "diff_journals",
    "journaled",
    "Comparison",
    "DIFF_SCHEMA_VERSION",
    "DTYPE_TOLERANCES",
    "DiffReport",
    "DiffSide",
    "Difference",
    "EXPORT_FORMAT_VERSION",
    "OpaqueReader",
    "OpaqueValue",
    "PairDiff",
    "Tolerance",
    "Tolerances",
    "ToolCallRow",
    "ToolStepSummary",
    "compare_values",
    "export_payloads",
    "first_tool_difference",
    "tool_call_rows",
    "tool_step_summaries",
]

__getattr__, __dir__ = lazy_face(globals())
