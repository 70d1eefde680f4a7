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


import difflib
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
    close = difflib.get_close_matches(key, known, n=1)
    meant = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{GROUP} has no key {key!r}{meant}; its keys are {', '.join(known)}"


def _with_suggestions(step: Any) -> Any:
    """One of Hydra's composition steps, with a did-you-mean added to a failure under the ``stepjournal`` section."""
    from hydra.errors import ConfigCompositionException

    def composing(*args: Any, **kwargs: Any) -> Any:
        try:
            return step(*args, **kwargs)
        except ConfigCompositionException as exc:
            # Hydra raises from OmegaConf's error (an override) or inside its handler (a config file).
            source = exc.__cause__ or exc.__context__
            full_key = getattr(source, "full_key", None)
            if not isinstance(full_key, str) or not full_key:
                full_key = getattr(source, "key", None)  # a section the config lacks: its key alone
            hint = suggestion(full_key) if isinstance(full_key, str) and full_key else None
            if hint is None:
                raise
            raise ConfigCompositionException(f"{exc}\n{hint}") from source

    composing.stepjournal_suggests = True  # type: ignore[attr-defined]
    return composing


def register() -> None:
    """Store the section under ``stepjournal/verl`` and add the did-you-mean to Hydra's composition (once)."""
    from hydra.core.config_store import ConfigStore
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    ConfigStore.instance().store(group=GROUP, name=OPTION, node=StepJournalSection)
    # Hydra has no hook for composition errors: its two steps that merge what a user wrote (the
    # command line's overrides, the config files) are wrapped, once, and only add a line to a failure
    # whose key lies under `stepjournal`; every other error is raised unchanged.
    overrides = ConfigLoaderImpl.__dict__["_apply_overrides_to_config"].__func__
    if not getattr(overrides, "stepjournal_suggests", False):
        ConfigLoaderImpl._apply_overrides_to_config = staticmethod(_with_suggestions(overrides))  # type: ignore[method-assign]
    files = ConfigLoaderImpl._compose_config_from_defaults_list
    if not getattr(files, "stepjournal_suggests", False):
        ConfigLoaderImpl._compose_config_from_defaults_list = _with_suggestions(files)  # type: ignore[method-assign]


try:
    register()
except (ImportError, KeyError, AttributeError):
    # Another Hydra than the one this was written for (1.3): a Hydra application must still start, and
    # verl configs still read (`read_verl_config` checks the keys and suggests the one meant).
    pass
