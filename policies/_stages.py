"""A policy per stage: `StagePolicies` and `parse_stages`, which reads every form a user writes one in.

Forms (see docs/stages.md):

- one spec for every stage: ``"cache"`` (any spec `parse` takes);
- a mapping, in Python or in a config section: ``{"generate": "cache", "reward": "replay@1-5"}``;
- compact text, for a command line and Hydra overrides: ``"generate:cache/reward:replay@1-5"``:
  stages separated by ``/``, each ``stage:spec``. Neither ``/`` nor ``:`` means anything to a shell
  or to Hydra's override grammar (``,`` and ``=`` do), so the text needs no quotes unless a stage's
  own spec holds ``;`` or ``,``.

A stage a per-stage spec does not name is bypassed: it runs, is journaled as bypassed, and nothing
of it is stored or replayed, so nothing replays that the user did not ask for.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Dict, Optional, Sequence

import attrs

from stepjournal.errors import InvalidKeyError
from stepjournal.vocabulary import check_stage

from ._base import BypassCall, CallContext, Decision, JournalView, is_policy
from ._errors import SpecError
from ._options import unknown_keys_text
from ._spec import parse

__all__ = ["StagePolicies", "parse_stages", "STAGE_SEPARATOR"]

# Between the stages of the compact text form, and between a stage and its spec.
STAGE_SEPARATOR = "/"
_ASSIGN = ":"
# A stage name in the compact text form: what a policy name may hold, so the first ':' is the assignment.
_STAGE_TEXT = re.compile(r"^\s*(?P<stage>[A-Za-z_][A-Za-z0-9_.\-]*)\s*:(?P<spec>.*)$", re.S)


def _is_stage_text(text: str) -> bool:
    """Whether `text` is the compact per-stage form (its first clause starts with ``name:``)."""
    return _STAGE_TEXT.match(text.split(STAGE_SEPARATOR, 1)[0]) is not None


@attrs.frozen
class StagePolicies:
    """One policy per stage; a policy itself, deciding each call with the policy of its stage.

    Attributes:
        policies: stage name -> policy.
        name: the spec in compact text form (``"generate:cache/reward:replay@1-5"``), for the audit.

    A call of a stage not in `policies` is bypassed (journaled as bypassed, nothing stored or
    replayed), with the reason saying so.
    """

    policies: Dict[str, Any]
    name: str = ""

    def __attrs_post_init__(self) -> None:
        if not self.name:
            text = STAGE_SEPARATOR.join(f"{stage}{_ASSIGN}{policy.name}" for stage, policy in self.policies.items())
            object.__setattr__(self, "name", text)

    @property
    def stages(self) -> tuple:
        """The stages this spec names, in order."""
        return tuple(self.policies)

    def for_stage(self, stage: str) -> Optional[Any]:
        """The policy of `stage`, or None when the spec does not name it (its calls are bypassed)."""
        return self.policies.get(stage)

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        policy = self.policies.get(ctx.stage)
        if policy is None:
            return BypassCall(
                reason=f"stage {ctx.stage!r} has no policy in the per-stage spec {self.name!r}: it ran, "
                "nothing stored or replayed",
                policy="bypass",
            )
        decision = policy.decide(ctx, view)
        return attrs.evolve(decision, policy=decision.policy or policy.name)


def _stage_name(stage: Any, declared: Optional[Sequence[str]]) -> str:
    try:
        check_stage(stage)
    except InvalidKeyError as exc:
        raise SpecError(f"per-stage spec: {exc}") from None
    if declared is not None and stage not in declared:
        raise SpecError(
            "per-stage spec names unknown stage " + unknown_keys_text([stage], tuple(declared), "the stages here are")
        )
    return stage


def _one(stage: str, spec: Any) -> Any:
    if is_policy(spec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"stage {stage!r}: the policy must be a spec string such as 'cache' (or a policy), "
                        f"got {spec!r}")
    try:
        return parse(spec)
    except SpecError as exc:
        raise SpecError(f"stage {stage!r}: {exc}") from None


def parse_stages(spec: Any, *, stages: Optional[Sequence[str]] = None) -> Any:
    """Parse a policy spec that may select a policy per stage.

    Args:
        spec: one spec for every stage (``"cache"``, a policy object); a mapping of stage -> spec
            (or policy); or the compact text ``"generate:cache/reward:replay@1-5"``.
        stages: the stages the caller (an adapter) journals; a per-stage spec naming another is
            refused. None: any stage name is taken.

    Returns:
        The policy itself for one spec for every stage; a `StagePolicies` for a per-stage spec.

    Raises:
        SpecError: a stage name is unknown (with the closest declared one) or not valid as a key,
            named twice, or its spec does not parse (unknown policy: with the closest names).
        PluginError: a stage's spec names a plugin that fails to load.
    """
    if isinstance(spec, StagePolicies):
        for stage in spec.policies:
            _stage_name(stage, stages)
        return spec
    if is_policy(spec):
        return spec
    if isinstance(spec, Mapping):
        if not spec:
            raise SpecError("per-stage spec is empty: name at least one stage, e.g. {'generate': 'cache'}")
        return StagePolicies({_stage_name(k, stages): _one(str(k), v) for k, v in spec.items()})
    if not isinstance(spec, str):
        raise SpecError(f"a policy spec is a string, a mapping of stage -> spec, or a policy; got {spec!r}")
    if not _is_stage_text(spec):
        return parse(spec)
    policies: Dict[str, Any] = {}
    for part in spec.split(STAGE_SEPARATOR):
        found = _STAGE_TEXT.match(part)
        if found is None:
            raise SpecError(
                f"per-stage spec {spec!r}: {part!r} is not 'stage:spec'; write e.g. 'generate:cache/reward:replay@1-5'"
            )
        stage = _stage_name(found["stage"], stages)
        if stage in policies:
            raise SpecError(f"per-stage spec {spec!r} names stage {stage!r} twice; give each stage once")
        policies[stage] = _one(stage, found["spec"].strip())
    return StagePolicies(policies, name=spec.strip())
