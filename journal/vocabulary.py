"""`stepjournal.vocabulary`: the words every room shares, in one public module.

The default stage and mode, the actions of a call (a ``str`` enum: stored text is unchanged), the
one colour of each action, the outcomes of a tool call (a ``str`` enum too), a stage's role and an
adapter's declaration of its stages, and the checks of a run key, mode, stage and step. Policies and
adapters import these from here, never from the journal's private modules (docs/architecture.md, "The
vocabulary").
"""

from .events._keys import DEFAULT_MODE, DEFAULT_STAGE, MAX_GEN_INDEX, MAX_STEP, check_key, check_stage, check_step
from .events._words import (ACTION_COLOURS, CALL_ACTIONS, Action, Stage, StageRole, ToolOutcome, check_stages,
                            stage_names)

__all__ = [
    "DEFAULT_STAGE",
    "DEFAULT_MODE",
    "Action",
    "CALL_ACTIONS",
    "ACTION_COLOURS",
    "ToolOutcome",
    "StageRole",
    "Stage",
    "stage_names",
    "check_stages",
    "check_key",
    "check_stage",
    "check_step",
    "MAX_STEP",
    "MAX_GEN_INDEX",
]
