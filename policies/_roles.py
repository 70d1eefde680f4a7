"""A stage's role, enforced: which policies may decide a stage its adapter declares record-only.

The adapter that owns a stage declares its role (`stepjournal.vocabulary.Stage`, `StageRole`); the
engine checks a per-stage spec against the declarations when it is made, and refuses a decision that
would serve a record-only stage from the journal when it is made. Nothing here reads a policy's name.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from stepjournal.errors import StageRoleError
from stepjournal.vocabulary import Stage, StageRole

from ._base import Policy
from ._builtin import Bypass, Dump, Passthrough
from ._spec import Schedule
from ._stages import StagePolicies

__all__ = ["may_replay", "role_of", "check_stage_roles"]

# The built-in policies that always run the call: they record, journal or bypass, never serve.
_RUN_ALWAYS = (Dump, Passthrough, Bypass)


def may_replay(policy: Policy) -> bool:
    """Whether `policy` may serve a call from the journal instead of running it.

    ``dump``, ``passthrough`` and ``bypass`` never do, nor a schedule or per-stage spec of them only;
    any other policy (a plugin's too: what it decides is its own) may.
    """
    if isinstance(policy, _RUN_ALWAYS):
        return False
    if isinstance(policy, Schedule):
        return any(may_replay(clause) for _, clause, _ in policy.clauses)
    if isinstance(policy, StagePolicies):
        return any(may_replay(chosen) for chosen in policy.policies.values())
    return True


def role_of(stage: str, declared: Iterable[Stage]) -> StageRole:
    """The role its adapter declared for `stage` (a part ``reward.<name>`` takes its stage's); a stage
    nobody declared may replay."""
    for declaration in declared:
        if declaration.owns(stage):
            return declaration.role
    return StageRole.MAY_REPLAY


def check_stage_roles(policy: Policy, declared: Sequence[Stage]) -> None:
    """Refuse a per-stage spec that gives a record-only stage a policy that may replay.

    Raises:
        StageRoleError: naming the stage, its role and the policy.
    """
    if not isinstance(policy, StagePolicies):
        return
    for stage, chosen in policy.policies.items():
        role = role_of(stage, declared)
        if role is StageRole.RECORD_ONLY and may_replay(chosen):
            raise StageRoleError(stage=stage, role=role, policy=chosen.name)
