"""The projections of the events: the step, rank, session and runs indexes, the call rows, where pulled events
sit, the audit folds and a step's samples.

Public here: what the audit and the queries hand back (docs/journal.md, "Auditing").
"""

from typing import TYPE_CHECKING

from ..base._face import lazy_face

if TYPE_CHECKING:
    from ._audit import AuditRecord, session_names, summarize_runs
    from ._projections import RecordedGeneration
    from ._runs_index import RunSummary

__all__ = ["AuditRecord", "RecordedGeneration", "RunSummary", "session_names", "summarize_runs"]

__getattr__, __dir__ = lazy_face(globals())
