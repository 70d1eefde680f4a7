"""The ``stepjournal`` section of a verl config, as a structured config in Hydra's ConfigStore.

Hydra imports every module of the ``hydra_plugins`` namespace before it composes a config, so any
Hydra application (verl's ``main_ppo``, ``fully_async_main``) finds the section without importing
stepjournal. Select it with ``+stepjournal=verl``; the section's keys are then typed and checked
when Hydra composes: ``stepjournal.polcy=cache`` fails there, and the message names the key meant
(``did you mean 'policy'?``). docs/verl.md shows the lines; ``stepjournal verl-config`` prints them.

This module imports neither stepjournal nor verl (every Hydra application of the environment runs
it). Its keys are those of ``stepjournal.adapters.verl.read_verl_config``'s native section;
tests/integration/test_verl_config_cli.py fails when the two differ.
"""


from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional

__all__ = ["StepJournalSection", "GROUP", "OPTION", "register", "suggestion"]

GROUP = "stepjournal"  # the config group, and the section's key in the composed config
OPTION = "verl"  # `+stepjournal=verl` selects the section


@dataclass
class StepJournalSection:
    """The keys of verl's ``stepjournal`` section (docs/verl.md, "The native section").

    ``None`` means unset: `read_verl_config` applies its own default. ``policy`` is a spec string or a
    per-stage mapping, so it is typed ``Any``.
    """

    enable: bool = True
    policy: Any = None
    path: Optional[str] = None
    dump_dir: Optional[str] = None
    run: Optional[str] = None
    fingerprint: Dict[str, Any] = field(default_factory=dict)
    fingerprint_ignore: List[str] = field(default_factory=list)
    compression: Optional[str] = None
    max_size: Optional[int] = None
    retention: Optional[Dict[str, Any]] = None
    payload_store: Optional[str] = None
    step_source: Optional[str] = None
    # stepjournal.policies.EngineOptions, one key each
    allow_fingerprint_mismatch: Optional[bool] = None
    verify_input: Optional[bool] = None
    on_input_mismatch: Optional[str] = None
    on_stage_input_mismatch: Optional[str] = None
    check_prompts: Optional[str] = None
    bypass_modes: Optional[List[str]] = None
    on_corrupt: Optional[str] = None


def keys() -> List[str]:
    """The section's keys, in order."""
    return [f.name for f in fields(StepJournalSection)]


def suggestion(full_key: str) -> Optional[str]:
    """What to tell someone whose override named `full_key` (``stepjournal.polcy``); None when it is
    not under the section or is one of its keys."""
    head, _, rest = full_key.partition(".")
    if head != GROUP:
        return None
    if not rest:
        return f"select the checked stepjournal section first: +{GROUP}={OPTION}"
    key = rest.split(".", 1)[0]
    known = keys()
    if key in known:
        return None
    import difflib  # only on a failure: every Hydra application imports this module

    close = difflib.get_close_matches(key, known, n=1)
    meant = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{GROUP} has no key {key!r}{meant}; its keys are {', '.join(known)}"


def _hint(source: Any, args: Any) -> Optional[str]:
    """The line to add to a composition failure caused by `source` (OmegaConf's error), or None.

    Only a key under this section gets one (OmegaConf names the section's class as the failing node's
    ``object_type``), and the "select the section" line only in a verl config (it holds
    ``actor_rollout_ref``): any other Hydra application, one with a ``stepjournal`` key or group of its
    own included, keeps Hydra's message unchanged.
    """
    full_key = getattr(source, "full_key", None)
    if getattr(source, "object_type", None) is StepJournalSection and isinstance(full_key, str):
        return suggestion(full_key)
    if getattr(source, "key", None) != GROUP or full_key != GROUP:  # not the section missing from the config
        return None
    cfg = next((arg for arg in args if type(arg).__name__ == "DictConfig"), None)
    return suggestion(GROUP) if cfg is not None and "actor_rollout_ref" in cfg else None


def _with_suggestions(step: Any) -> Any:
    """One of Hydra's composition steps, with a did-you-mean added to a failure under the ``stepjournal`` section."""
    from hydra.errors import ConfigCompositionException

    def composing(*args: Any, **kwargs: Any) -> Any:
        try:
            return step(*args, **kwargs)
        except ConfigCompositionException as exc:
            # Hydra raises from OmegaConf's error (an override) or inside its handler (a config file).
            source = exc.__cause__ or exc.__context__
            hint = _hint(source, args)
            if hint is None:
                raise
            raise ConfigCompositionException(f"{exc}\n{hint}") from source

    composing.stepjournal_suggests = True  # type: ignore[attr-defined]
    return composing


def register() -> None:
    """Store the section under ``stepjournal/verl`` (Hydra's public ConfigStore), then add the did-you-mean
    to Hydra's composition (once) where this Hydra's private layout is the one it was written for."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group=GROUP, name=OPTION, node=StepJournalSection)
    try:
        _suggest_in_composition()
    except (ImportError, KeyError, AttributeError):
        # Another Hydra than the one this was written for (1.3): the section is registered and its keys
        # checked, only the did-you-mean line is missing (`read_verl_config` still suggests the key meant).
        pass


def _suggest_in_composition() -> None:
    """Wrap the two private steps of Hydra 1.3 that merge what a user wrote (the command line's overrides,
    the config files): Hydra has no public hook for a composition error. The wrappers only add a line to a
    failure under this section; every other error is raised unchanged."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    overrides = ConfigLoaderImpl.__dict__["_apply_overrides_to_config"].__func__
    files = ConfigLoaderImpl.__dict__["_compose_config_from_defaults_list"]
    if not getattr(overrides, "stepjournal_suggests", False):
        ConfigLoaderImpl._apply_overrides_to_config = staticmethod(_with_suggestions(overrides))  # type: ignore[method-assign]
    if not getattr(files, "stepjournal_suggests", False):
        ConfigLoaderImpl._compose_config_from_defaults_list = _with_suggestions(files)  # type: ignore[method-assign]


try:
    register()
except ImportError:  # no Hydra ConfigStore at all: nothing to register into; a Hydra application must still start
    pass
