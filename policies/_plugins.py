"""Policy plugins: discovery through entry points, loading with errors that name the plugin, a report."""

from __future__ import annotations

import difflib
import inspect
import os
from typing import TYPE_CHECKING, Any, Collection, Dict, Optional, Tuple

import attrs

from stepjournal.log import get_logger
from ._base import is_policy
from ._builtin import BUILTIN_POLICIES
from ._errors import PluginError, PluginLoadError, SpecError

if TYPE_CHECKING:  # importlib.metadata is imported where plugins are looked up: a spec of built-ins never pays it
    from importlib.metadata import EntryPoint

__all__ = ["PluginStatus", "plugin_names", "plugin_report", "PLUGIN_GROUP", "DISABLE_PLUGINS_ENV"]

log = get_logger(__name__)

PLUGIN_GROUP = "stepjournal.policies"
DISABLE_PLUGINS_ENV = "STEPJOURNAL_DISABLE_PLUGIN_AUTOLOAD"


@attrs.frozen
class PluginStatus:
    """One installed policy plugin, as `plugin_report` finds it.

    Attributes:
        name: the policy name (the entry point's name).
        target: the entry point's ``module:attr``.
        distribution, version: the distribution that declares it (None when unknown).
        loads: it imports and gives a policy class, factory or instance.
        error: why it does not load (``"ModuleNotFoundError: No module named 'x'"``), else None.
        shadowed: a built-in policy has the same name, so specs never reach the plugin.
    """

    name: str
    target: str
    distribution: Optional[str]
    version: Optional[str]
    loads: bool
    error: Optional[str] = None
    shadowed: bool = False


def _autoload_disabled() -> bool:
    return os.environ.get(DISABLE_PLUGINS_ENV, "") not in ("", "0")


def plugin_names() -> Dict[str, str]:
    """Installed policy plugins: name -> ``module:attr`` (empty when autoload is disabled)."""
    from importlib.metadata import entry_points

    if _autoload_disabled():
        return {}
    return {ep.name: ep.value for ep in entry_points(group=PLUGIN_GROUP)}


def plugin_report() -> Tuple[PluginStatus, ...]:
    """Every installed policy plugin, imported to see whether it loads; sorted by name.

    A plugin loads when it imports and gives a policy instance, or a class or factory that is a
    policy once built (one that needs arguments is built only by a spec that gives them, so it
    counts as loading when it imports). Empty when plugin discovery is off
    (``STEPJOURNAL_DISABLE_PLUGIN_AUTOLOAD``). Importing a plugin runs its module's code, as using
    it in a spec would.
    """
    from importlib.metadata import entry_points

    if _autoload_disabled():
        return ()
    report = []
    for ep in sorted(entry_points(group=PLUGIN_GROUP), key=lambda ep: ep.name):
        distribution, version = _dist(ep)
        error = None
        try:
            error = _builds_no_policy(_import_plugin(ep))
        except PluginLoadError as exc:
            error = exc.error
        report.append(
            PluginStatus(
                name=ep.name, target=ep.value, distribution=distribution, version=version,
                loads=error is None, error=error, shadowed=ep.name in BUILTIN_POLICIES,
            )
        )
    return tuple(report)


def _builds_no_policy(obj: Any) -> Optional[str]:
    """Why a class or factory that takes no required arguments does not give a policy, else None."""
    if is_policy(obj) and not isinstance(obj, type):
        return None
    try:
        inspect.signature(obj).bind()
    except (TypeError, ValueError):  # it needs arguments (or cannot be inspected): a spec supplies them
        return None
    try:
        built = obj()
    except Exception as exc:  # building a plugin's policy can fail in any way; report it
        return f"building it failed: {type(exc).__name__}: {exc}"
    return None if is_policy(built) else f"it produced {type(built).__name__}, not a policy"


def _dist(ep: EntryPoint) -> Tuple[Optional[str], Optional[str]]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return None, None
    return dist.name, dist.version


def _where(ep: EntryPoint) -> str:
    distribution, version = _dist(ep)
    return "an unknown distribution" if distribution is None else f"distribution {distribution} {version}"


def _origin(ep: EntryPoint) -> str:
    return f"plugin {ep.value} from {_where(ep)}"


def not_a_policy(name: str, origin: str, ep: Optional[EntryPoint], what: str) -> PluginError:
    """The error for a policy name whose factory `what` (e.g. "produced int") is not a policy."""
    message = (
        f"{origin} {name!r} {what}, which is not a policy: a policy needs a str attribute `name` and a "
        "method `decide(ctx, view)`"
    )
    if ep is None:
        return PluginError(message)
    distribution, version = _dist(ep)
    return PluginLoadError(
        message, plugin=name, target=ep.value, distribution=distribution, version=version,
        error=f"{what}, not a policy",
    )


def _import_plugin(ep: EntryPoint) -> Any:
    """Import what the entry point names; PluginLoadError (with the import error) when that fails."""
    distribution, version = _dist(ep)
    try:
        obj = ep.load()
    except Exception as exc:  # a plugin's import can fail in any way; name it and its distribution
        error = f"{type(exc).__name__}: {exc}"
        raise PluginLoadError(
            f"policy plugin {ep.name!r} (entry point {ep.value}, {_where(ep)}) failed to load: {error}; install "
            f"what it needs or reinstall {distribution or 'its distribution'}, or name another policy",
            plugin=ep.name, target=ep.value, distribution=distribution, version=version, error=error,
        ) from exc
    if not callable(obj) and not is_policy(obj):
        raise PluginLoadError(
            f"{_origin(ep)}: {ep.name!r} is a {type(obj).__name__}, not a policy class or factory",
            plugin=ep.name, target=ep.value, distribution=distribution, version=version,
            error=f"{type(obj).__name__} is not a policy class or factory",
        )
    return obj


def load_plugin(name: str) -> Tuple[Any, str, EntryPoint]:
    """What the plugin `name` provides, how errors name it, and its entry point.

    Raises:
        SpecError: no plugin has that name (with the closest names), or discovery is off.
        PluginLoadError: it fails to import, or is neither a policy nor a callable.
    """
    known = ", ".join(sorted(BUILTIN_POLICIES))
    if _autoload_disabled():
        raise SpecError(
            f"unknown policy {name!r}{_suggest(name, BUILTIN_POLICIES)}: built-in policies are {known}; plugin "
            f"discovery is off ({DISABLE_PLUGINS_ENV} is set)"
        )
    from importlib.metadata import entry_points

    installed = list(entry_points(group=PLUGIN_GROUP))
    found = [ep for ep in installed if ep.name == name]
    if not found:
        plugins = ", ".join(sorted(ep.name for ep in installed)) or "none installed"
        candidates = list(BUILTIN_POLICIES) + [ep.name for ep in installed]
        raise SpecError(
            f"unknown policy {name!r}{_suggest(name, candidates)}: built-in policies are {known}; plugins: {plugins}"
        )
    ep = found[0]
    obj = _import_plugin(ep)
    distribution, version = _dist(ep)
    log.debug("policy_plugin_loaded", name=name, value=ep.value, distribution=distribution, version=version)
    return obj, _origin(ep), ep


def _suggest(name: str, candidates: Collection[str]) -> str:
    close = difflib.get_close_matches(name, sorted(set(candidates)), n=3, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(c) for c in close) + "?)"
