"""Policy specs (``"dump@1-5;repeat"``), schedules, and policies found by name (built-in or plugin)."""

from __future__ import annotations

import inspect
import math
import re
import typing
from typing import Any, Dict, List, Optional, Sequence, Tuple

import attrs

from stepjournal.log import warn

from ._base import CallContext, Decision, JournalView, Policy, is_policy
from ._builtin import BUILTIN_POLICIES, Bypass, Nearest, Passthrough, Repeat, RepeatLast
from ._errors import SpecError, SpecWarning
from ._plugins import DISABLE_PLUGINS_ENV, PLUGIN_GROUP, load_plugin, not_a_policy, plugin_names
from ._ranges import StepRange, StepRanges

# The plugin names are re-exported here too, for code that imports them with the specs.
__all__ = ["Schedule", "parse", "policy_by_name", "plugin_names", "PLUGIN_GROUP", "DISABLE_PLUGINS_ENV"]


_CLAUSE = re.compile(
    r"^\s*(?P<name>[A-Za-z_][A-Za-z0-9_.\-]*)\s*(?:\((?P<args>[^()]*)\))?\s*(?:@(?P<ranges>.*))?$", re.S
)
_ARG = re.compile(r"^\s*(?P<key>[A-Za-z_][A-Za-z0-9_]*)\s*=\s*(?P<value>[^,=\s]+)\s*$")


# Policies that serve a call from *other* recorded steps; in a schedule they see only the steps that
# earlier clauses record (see Schedule). Passthrough and bypass store nothing, so they record no steps.
_SERVES_OTHER_STEPS = (Repeat, RepeatLast, Nearest)
_STORES_NOTHING = (Passthrough, Bypass)


@attrs.frozen
class Schedule:
    """An ordered list of (step ranges, policy) clauses: the first clause whose ranges hold the step decides.

    Steps no clause covers go to `default` (passthrough unless given).

    A `repeat`, `repeat_last` or `nearest` clause that follows clauses which record (any clause but
    another of those three, `passthrough` and `bypass`) serves only recorded steps inside those
    clauses' ranges: ``dump@1-5;repeat`` cycles through steps 1-5 even when an earlier session
    recorded more. With no recording clause before it, such a clause sees every recorded step.
    """

    clauses: Tuple[Tuple[StepRanges, Policy, str], ...]
    default: Policy = attrs.field(factory=Passthrough)
    name: str = ""
    # Per clause: the steps its policy may serve from (None: every recorded step).
    scopes: Tuple[Optional[StepRanges], ...] = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", ";".join(label for _, _, label in self.clauses))
        scopes: List[Optional[StepRanges]] = []
        for number, (_, policy, _) in enumerate(self.clauses):
            sources = [
                r
                for ranges, earlier, _ in self.clauses[:number]
                if not isinstance(earlier, _SERVES_OTHER_STEPS + _STORES_NOTHING)
                for r in ranges.ranges
            ]
            scopes.append(StepRanges(tuple(sources)) if sources and isinstance(policy, _SERVES_OTHER_STEPS) else None)
        object.__setattr__(self, "scopes", tuple(scopes))

    def select(self, step: int) -> Tuple[Any, str]:
        """The policy that decides `step`, and the clause's label for the audit."""
        policy, label, _ = self._clause(step)
        return policy, label

    def _clause(self, step: int) -> Tuple[Any, str, Optional[StepRanges]]:
        for (ranges, policy, label), scope in zip(self.clauses, self.scopes):
            if step in ranges:
                return policy, label, scope
        return self.default, f"{self.default.name} (default)", None

    def decide(self, ctx: CallContext, view: JournalView) -> Decision:
        policy, label, scope = self._clause(ctx.step)
        decision = policy.decide(ctx, view if scope is None else view.restricted(scope))
        return attrs.evolve(decision, policy=decision.policy or label)


def _value(text: str) -> Any:
    """A spec argument's value when its parameter has no type to go by."""
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
    built-in policies or plugins of the entry-point group ``stepjournal.policies``. Arguments are
    converted to the types the policy's constructor annotates (bool, int, float, str, Literal,
    Optional) when the spec is parsed.

    Examples: ``"cache"``, ``"dump@1-5;repeat"``, ``"replay(on_missing=generate)@1-10;passthrough"``.

    Returns:
        The policy itself for a single clause without ranges, else a `Schedule`.

    Raises:
        SpecError: the spec is malformed, names an unknown policy (with the closest names), or gives
            an argument the policy does not take or a value of the wrong type (the message says which).
        PluginError: a plugin failed to load or is not a policy (a `PluginLoadError`).

    Warns:
        SpecWarning: a clause can never decide a step, because earlier clauses take all its steps.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise SpecError(f"policy spec must be a non-empty string like 'dump@1-5;repeat', got {spec!r}")
    clauses = []
    for number, text in enumerate(spec.split(";"), 1):
        match = _CLAUSE.match(text)
        where = f"policy spec clause {number} {text.strip()!r}"
        if match is None:
            raise SpecError(
                f"{where} is malformed: expected name, name(key=value) or either followed by @ranges, in spec {spec!r}"
            )
        raw: Dict[str, str] = {}
        if match.group("args") and match.group("args").strip():
            for arg in match.group("args").split(","):
                am = _ARG.match(arg)
                if am is None:
                    raise SpecError(f"{where}: argument {arg.strip()!r} is not key=value")
                raw[am.group("key")] = am.group("value")
        ranges_text = match.group("ranges")
        if ranges_text is None:
            ranges = StepRanges.every()
        else:
            try:
                ranges = StepRanges.parse(ranges_text)
            except SpecError as exc:
                raise SpecError(f"{where}: {exc}") from None
        try:
            policy = _build(match.group("name"), raw, from_text=True)
        except SpecError as exc:
            raise SpecError(f"{where}: {exc}") from None
        clauses.append((ranges, policy, text.strip()))
    for message in _unreachable(clauses):
        warn(f"{message} (in policy spec {spec!r})", SpecWarning)  # at the user's line, not the library's
    if len(clauses) == 1 and ranges_text is None:  # the one clause has no @ranges
        return clauses[0][1]
    return Schedule(tuple(clauses), name=";".join(label for _, _, label in clauses))


def policy_by_name(name: str, **kwargs: Any) -> Any:
    """Build a policy from its name (built-in first, then plugins) and keyword arguments.

    Arguments are checked against the types the policy's constructor annotates (bool, int, float,
    str, Literal, Optional); an int is accepted for a float.

    Raises:
        SpecError: no policy has that name, or the arguments do not fit it.
        PluginError: the plugin failed to import, or what it provides is not a policy.
    """
    return _build(name, kwargs, from_text=False)


# -- arguments ---------------------------------------------------------------------------------------
class _Mismatch(Exception):
    """A value does not fit a parameter's type; args[0] says what was expected."""


def _build(name: str, args: Dict[str, Any], *, from_text: bool) -> Any:
    factory = BUILTIN_POLICIES.get(name)
    origin, ep = "built-in policy", None
    if factory is None:
        factory, origin, ep = load_plugin(name)
    if is_policy(factory) and not isinstance(factory, type):
        if args:
            raise SpecError(f"policy {name!r} ({origin}) is an instance and takes no arguments, got {args}")
        return factory
    kwargs = _check_arguments(name, origin, factory, args, from_text=from_text)
    try:
        policy = factory(**kwargs)
    except (TypeError, ValueError) as exc:
        detail = exc.args[0] if exc.args else exc  # attrs validators put the message first
        raise SpecError(f"policy {name!r} ({origin}) does not accept {kwargs}: {detail}") from None
    if not is_policy(policy):
        raise not_a_policy(name, origin, ep, f"produced {type(policy).__name__}")
    return policy


def _check_arguments(name: str, origin: str, factory: Any, args: Dict[str, Any], *, from_text: bool) -> Dict[str, Any]:
    """Convert (spec text) or check (Python values) each argument against the factory's signature."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # a callable Python cannot inspect: the call itself decides
        return {key: _value(value) if from_text else value for key, value in args.items()}
    params = {
        p.name: p
        for p in signature.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    open_kwargs = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
    hints = _type_hints(factory)
    out: Dict[str, Any] = {}
    for key, value in args.items():
        shown = f"{key}={value}" if from_text else f"{key}={value!r}"
        if key not in params and not open_kwargs:
            takes = ", ".join(params) or "no arguments"
            raise SpecError(f"policy {name!r} ({origin}) does not accept argument {shown}: it takes {takes}")
        hint = hints.get(key, hints.get(f"_{key}", inspect.Parameter.empty))
        try:
            out[key] = _from_text(value, hint) if from_text else _from_python(value, hint)
        except _Mismatch as exc:
            raise SpecError(
                f"policy {name!r} ({origin}): argument {key} must be {exc.args[0]}, got {value!r}"
            ) from None
    return out


def _type_hints(factory: Any) -> Dict[str, Any]:
    """The resolved annotations of a factory's parameters (attrs classes: of their fields)."""
    targets = (factory.__init__, factory) if inspect.isclass(factory) else (factory,)
    hints: Dict[str, Any] = {}
    for target in reversed(targets):  # the __init__'s own annotations win over the class's
        try:
            hints.update(typing.get_type_hints(target))
        except Exception:  # an annotation that does not resolve is simply not checked
            pass
    return hints


_SCALARS = {bool: "a bool (true or false)", int: "an int", float: "a float", str: "a str"}


def _describe(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is typing.Union:
        return " or ".join("None" if a is type(None) else _describe(a) for a in args)
    return _SCALARS.get(hint, getattr(hint, "__name__", str(hint)))


def _from_text(text: str, hint: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is inspect.Parameter.empty or hint is Any:
        return _value(text)
    if origin is typing.Literal:
        for option in args:
            if (text if isinstance(option, str) else _value(text)) == option:
                return option
        raise _Mismatch(_describe(hint))
    if origin is typing.Union:
        if type(None) in args and text.lower() in ("none", "null"):
            return None
        # Try str last, so that an int-or-str parameter gets an int from "3".
        for arg in sorted((a for a in args if a is not type(None)), key=lambda a: a is str):
            try:
                return _from_text(text, arg)
            except _Mismatch:
                pass
        raise _Mismatch(_describe(hint))
    if hint is bool:
        if text.lower() in ("true", "false"):
            return text.lower() == "true"
        raise _Mismatch(_describe(hint))
    if hint in (int, float):
        try:
            return hint(text)
        except ValueError:
            raise _Mismatch(_describe(hint)) from None
    if hint is str:
        return text
    return _value(text)  # a type the spec grammar cannot spell: pass the plain value on


def _from_python(value: Any, hint: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal:
        if value in args:
            return value
        raise _Mismatch(_describe(hint))
    if origin is typing.Union:
        for arg in args:
            if arg is type(None) and value is None:
                return None
            if arg is not type(None):
                try:
                    return _from_python(value, arg)
                except _Mismatch:
                    pass
        raise _Mismatch(_describe(hint))
    if hint in (bool, int, str) and not (isinstance(value, hint) and (hint is bool or not isinstance(value, bool))):
        raise _Mismatch(_describe(hint))
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Mismatch(_describe(hint))
        return float(value)
    return value


# -- unreachable clauses -----------------------------------------------------------------------------
def _unreachable(clauses: Sequence[Tuple[StepRanges, Any, str]]) -> List[str]:
    """A message for each clause whose steps earlier clauses take entirely."""
    messages = []
    for number, (ranges, _, label) in enumerate(clauses):
        earlier = [r for rs, _, _ in clauses[:number] for r in rs.ranges]
        if not earlier or not all(_covers(earlier, r) for r in ranges.ranges):
            continue
        alone = [
            (i, other_label, other)
            for i, (other, _, other_label) in enumerate(clauses[:number], 1)
            if all(_covers(other.ranges, r) for r in ranges.ranges)
        ]
        if alone:
            i, other_label, other = alone[0]
            takes = "matches every step" if _covers(other.ranges, StepRange(0, None)) else f"takes steps {other}"
            why = f"clause {i} {other_label!r} {takes}"
        else:
            why = f"clauses {', '.join(str(i) for i in range(1, number + 1))} take all its steps ({ranges})"
        messages.append(
            f"policy spec clause {number + 1} {label!r} can never be reached: {why}; the first clause whose "
            "ranges hold a step decides it, so move this clause earlier or narrow the earlier one's @ranges"
        )
    return messages


def _covers(earlier: Sequence[StepRange], r: StepRange, budget: int = 10_000) -> bool:
    """True when every step of `r` lies in one of `earlier` (False when that is too costly to decide).

    Between consecutive range boundaries the set of ranges that apply is fixed, and membership in
    them repeats with the lcm of their strides, so one period of `r`'s steps per segment decides it.
    """
    end = None if r.stop is None else r.stop + 1
    cuts = {r.start}
    for u in earlier:
        for cut in (u.start, None if u.stop is None else u.stop + 1):
            if cut is not None and cut > r.start and (end is None or cut < end):
                cuts.add(cut)
    bounds = sorted(cuts)
    for i, lo in enumerate(bounds):
        hi = bounds[i + 1] if i + 1 < len(bounds) else end
        first = lo + (r.start - lo) % r.stride
        if hi is not None and first >= hi:
            continue
        active = [u for u in earlier if u.start <= lo and (u.stop is None or u.stop >= lo)]
        if not active:
            return False
        points = math.lcm(r.stride, *(u.stride for u in active)) // r.stride
        if points > budget:
            return False
        for step in range(first, first + points * r.stride, r.stride):
            if hi is not None and step >= hi:
                break
            if not any(step in u for u in active):
                return False
    return True
