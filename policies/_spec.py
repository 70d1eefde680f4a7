"""Policy specs (``"dump@1-5;repeat"``), schedules, and policies found by name (built-in or plugin)."""

from __future__ import annotations

import os
import re
from importlib.metadata import entry_points
from typing import Any, Dict, Optional, Tuple

import attrs

from stepjournal._log import get_logger
from ._base import CallContext, Decision, JournalView, Policy, is_policy
from ._builtin import BUILTIN_POLICIES, Passthrough
from ._errors import PluginError, SpecError
from ._ranges import StepRanges

__all__ = ["Schedule", "parse", "policy_by_name", "plugin_names", "PLUGIN_GROUP", "DISABLE_PLUGINS_ENV"]

log = get_logger(__name__)

PLUGIN_GROUP = "stepjournal.policies"
DISABLE_PLUGINS_ENV = "STEPJOURNAL_DISABLE_PLUGIN_AUTOLOAD"

_CLAUSE = re.compile(
    r"^\s*(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)\s*(?:\((?P<args>[^()]*)\))?\s*(?:@(?P<ranges>.*))?$", re.S
)
_ARG = re.compile(r"^\s*(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<value>[^,=\s]+)\s*$")


@attrs.frozen
class Schedule:
    """An ordered list of (step ranges, policy) clauses: the first clause whose ranges hold the step decides.

    Steps no clause covers go to `default` (passthrough unless given).
    """

    clauses: Tuple[Tuple[StepRanges, Any, str], ...]
    default: Any = attrs.field(factory=Passthrough)
    name: str = ""

    def __attrs_post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", ";".join(label for _, _, label in self.clauses))

    def select(self, step: int) -> Tuple[Any, str]:
        """The policy that decides `step`, and the clause's label for the audit."""
        for ranges, policy, label in self.clauses:
            if step in ranges:
                return policy, label
        return self.default, f"{self.default.name} (default)"

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        policy, label = self.select(ctx.step)
        decision = policy.decide(ctx, view)
        return attrs.evolve(decision, policy=decision.policy or label)


def _value(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def parse(spec: str) -> Any:
    """Parse a policy spec into a policy.

    Grammar: clauses separated by ``;``, each ``name``, ``name(key=value, ...)`` or either followed by
    ``@ranges`` (see `StepRanges`). A clause without ``@ranges`` matches every step. Names are the
    built-in policies or plugins of the entry-point group ``stepjournal.policies``.

    Examples: ``"cache"``, ``"dump@1-5;repeat"``, ``"replay(on_missing=generate)@1-10;passthrough"``.

    Returns:
        The policy itself for a single clause without ranges, else a `Schedule`.

    Raises:
        SpecError: the spec is malformed or names an unknown policy (the message says which clause).
        PluginError: a plugin failed to load or is not a policy.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"policy spec must be a non-empty string like 'dump@1-5;repeat', got {spec!r}")
    clauses = []
    for number, text in enumerate(spec.split(";"), 1):
        match = _CLAUSE.match(text)
        if match is None:
            raise SpecError(
                f"policy spec clause {number} {text.strip()!r} is malformed: expected name, name(key=value) "
                f"or either followed by @ranges, in spec {spec!r}"
            )
        kwargs: Dict[str, Any] = {}
        if match.group("args") and match.group("args").strip():
            for arg in match.group("args").split(","):
                am = _ARG.match(arg)
                if am is None:
                    raise SpecError(f"policy spec clause {number} {text.strip()!r}: argument {arg.strip()!r} is not key=value")
                kwargs[am.group("key")] = _value(am.group("value"))
        ranges_text = match.group("ranges")
        if ranges_text is None:
            ranges = StepRanges.every()
        else:
            try:
                ranges = StepRanges.parse(ranges_text)
            except SpecError as exc:
                raise SpecError(f"policy spec clause {number} {text.strip()!r}: {exc}") from None
        policy = policy_by_name(match.group("name"), **kwargs)
        clauses.append((ranges, policy, text.strip()))
    if len(clauses) == 1 and match.group("ranges") is None:
        return clauses[0][1]
    return Schedule(tuple(clauses), name=";".join(label for _, _, label in clauses))


def plugin_names() -> Dict[str, str]:
    """Installed policy plugins: name -> ``module:attr`` (empty when autoload is disabled)."""
    if os.environ.get(DISABLE_PLUGINS_ENV, "") not in ("", "0"):
        return {}
    return {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP)}


def policy_by_name(name: str, **kwargs: Any) -> Any:
    """Build a policy from its name (built-in first, then plugins) and keyword arguments.

    Raises:
        SpecError: no policy has that name, or the arguments do not fit it.
        PluginError: the plugin failed to import, or what it provides is not a policy.
    """
    factory = BUILTIN_POLICIES.get(name)
    origin = "built-in policy"
    if factory is None:
        factory, origin = _load_plugin(name)
    if is_policy(factory) and not isinstance(factory, type):
        if kwargs:
            raise SpecError(f"policy {name!r} ({origin}) is an instance and takes no arguments, got {kwargs}")
        return factory
    try:
        policy = factory(**kwargs)
    except (TypeError, ValueError) as exc:
        detail = exc.args[0] if exc.args else exc  # attrs validators put the message first
        raise SpecError(f"policy {name!r} ({origin}) does not accept {kwargs}: {detail}") from None
    if not is_policy(policy):
        raise PluginError(
            f"{origin} {name!r} produced {type(policy).__name__}, which is not a policy: "
            "a policy needs a str attribute `name` and a method `decide(ctx, view)`"
        )
    return policy


def _load_plugin(name: str) -> Tuple[Any, str]:
    disabled = os.environ.get(DISABLE_PLUGINS_ENV, "") not in ("", "0")
    known = ", ".join(sorted(BUILTIN_POLICIES))
    if disabled:
        raise SpecError(
            f"unknown policy {name!r}: built-in policies are {known}; plugin discovery is off "
            f"({DISABLE_PLUGINS_ENV} is set)"
        )
    found = [ep for ep in entry_points(group=PLUGIN_GROUP) if ep.name == name]
    if not found:
        plugins = ", ".join(sorted(ep.name for ep in entry_points(group=PLUGIN_GROUP))) or "none installed"
        raise SpecError(f"unknown policy {name!r}: built-in policies are {known}; plugins: {plugins}")
    ep = found[0]
    dist = getattr(getattr(ep, "dist", None), "name", None) or "unknown distribution"
    origin = f"plugin {ep.value} from {dist}"
    try:
        obj = ep.load()
    except Exception as exc:  # a plugin's import can fail in any way; name it and its distribution
        raise PluginError(f"policy plugin {name!r} ({ep.value}, distribution {dist}) failed to load: {exc!r}") from exc
    if not callable(obj) and not is_policy(obj):
        raise PluginError(f"{origin}: {name!r} is a {type(obj).__name__}, not a policy class or factory")
    log.debug("policy_plugin_loaded", name=name, value=ep.value, distribution=dist)
    return obj, origin
