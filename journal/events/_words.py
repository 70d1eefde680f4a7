"""The words every room shares: what a call's action is called, what a tool call's outcome is called, what
a stage may do, how an adapter declares its stages. `stepjournal.vocabulary` is their public face.

The actions and the tool outcomes are ``str`` enums, so a stored event, an audit row and a JSON line hold
the same text as before (``"replayed"``); code compares with the enum's names, never with the literal.
"""

from __future__ import annotations

import enum
from typing import Dict, Iterable, Mapping, Sequence, Tuple

import attrs

from ..base._errors import InvalidKeyError
from ._keys import DEFAULT_MODE, DEFAULT_STAGE, check_stage

__all__ = [
    "DEFAULT_MODE",
    "DEFAULT_STAGE",
    "Action",
    "CALL_ACTIONS",
    "ACTION_COLOURS",
    "ToolOutcome",
    "StageRole",
    "Stage",
    "stage_names",
    "check_stages",
]


class _Word(str, enum.Enum):
    """A shared word: a ``str`` enum whose member is its stored text everywhere."""

    # The text itself in f-strings, str() and repr() (a list of outcomes' actions prints as before):
    # the stored word, never ``Action.REPLAYED``.
    __str__ = str.__str__

    def __format__(self, format_spec: str) -> str:  # str's own, as a method: the checker reads Enum's otherwise
        return str.__format__(self, format_spec)

    __repr__ = str.__repr__


class Action(_Word):
    """What happened to one journaled call, as its event, the audit and the CLI name it.

    The first four are the call actions (one event class each); ``released`` is an audit row's only:
    retention released the payloads of a recorded call.
    """

    GENERATED = "generated"
    REPLAYED = "replayed"
    BYPASSED = "bypassed"
    REFUSED = "refused"
    RELEASED = "released"


# The call actions, in the order the audit's rows and the runs index's counts list them.
CALL_ACTIONS: Tuple[Action, ...] = (Action.GENERATED, Action.REPLAYED, Action.BYPASSED, Action.REFUSED)

# The one colour of each action (hex, which rich's styles and SVG both take): the CLI's tables, the
# demo, the HTML report.
ACTION_COLOURS: Mapping[Action, str] = {
    Action.GENERATED: "#2ca02c",
    Action.REPLAYED: "#1f77b4",
    Action.BYPASSED: "#aaaaaa",
    Action.REFUSED: "#d62728",
    Action.RELEASED: "#9467bd",
}


class ToolOutcome(_Word):
    """What one journaled tool call was, as `audit --tools`, `show --text` and the report name it.

    Read from the call's event and the rule it was journaled under: ``recorded`` (the tool ran under a rule
    that serves no recordings, ``dump``), ``replayed`` (a recording was served), ``miss`` (the tool ran
    and was recorded under a rule that serves recordings: nothing matched), ``refused`` (a miss under
    ``replay``), ``bypassed`` (the tool ran, nothing stored) and ``caught up`` (a served call run again
    on the live environment when its sample left the recording).
    """

    RECORDED = "recorded"
    REPLAYED = "replayed"
    MISS = "miss"
    REFUSED = "refused"
    BYPASSED = "bypassed"
    CAUGHT_UP = "caught up"


class StageRole(str, enum.Enum):
    """What the engine lets a stage's calls be.

    ``may_replay``: any decision (a recorded call may be served instead of running).
    ``record_only``: the call always runs; it is recorded (or journaled with nothing stored) and never
    served from the journal: a step's metrics describe what happened, they do not feed training.
    """

    MAY_REPLAY = "may_replay"
    RECORD_ONLY = "record_only"


def _stage_name(_instance: object, _attribute: object, value: str) -> None:
    check_stage(value)


@attrs.frozen
class Stage:
    """One stage an adapter journals, declared by the adapter that owns it.

    Attributes:
        name: the stage's name in the journal's keys (``"generate"``, ``"metrics"`` ...).
        role: what the engine lets its calls be (`StageRole`).
        parts: whether the stage has named parts ``<name>.<part>`` (the TRL adapter's
            ``reward.<function>``), each with the stage's role.
    """

    name: str = attrs.field(validator=_stage_name)
    role: StageRole = attrs.field(default=StageRole.MAY_REPLAY, converter=StageRole)
    parts: bool = False

    def owns(self, stage: str) -> bool:
        """Whether `stage` is this stage or, when it has parts, one of them."""
        return stage == self.name or (self.parts and stage.startswith(self.name + "."))


def stage_names(stages: Iterable[Stage]) -> Tuple[str, ...]:
    """The names of `stages`, in their declared order."""
    return tuple(stage.name for stage in stages)


def check_stages(stages: Sequence[Stage]) -> Dict[str, Stage]:
    """Name -> declaration of an adapter's stages, refusing a name declared twice.

    Raises:
        InvalidKeyError: two declarations share a name.
    """
    found: Dict[str, Stage] = {}
    for stage in stages:
        if stage.name in found:
            raise InvalidKeyError(f"stage {stage.name!r} is declared twice: declare each stage once")
        found[stage.name] = stage
    return found
