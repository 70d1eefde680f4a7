"""Keeping a journal sound and small: retention and its release, prune, compact, verify.

Public here: retention and its plan, prune, compact and what verify reports (docs/retention.md).
"""

from typing import TYPE_CHECKING

from ..base._face import lazy_face

if TYPE_CHECKING:
    from ._compact import compact
    from ._prune import find_release, prune
    from ._retention import PlannedRelease, Retention, RetentionPlan, plan_retention
    from ._verify import VerifyProblem

__all__ = ["Retention", "RetentionPlan", "PlannedRelease", "plan_retention", "prune", "find_release", "compact",
           "VerifyProblem"]

__getattr__, __dir__ = lazy_face(globals())
