"""Read a verl config in any of its rollout-skip forms and turn it into a stepjournal config.

Forms understood (see docs/verl.md for the migration guide):

| form                        | keys                                                                  |
|-----------------------------|-----------------------------------------------------------------------|
| ``stepjournal``             | top-level ``stepjournal.{policy, path, run, fingerprint, ...}``       |
| ``rollout_skip_v1``         | ``actor_rollout_ref.rollout.skip_rollout`` / ``skip_dump_dir``        |
| ``rollout_skip_v2``         | ``actor_rollout_ref.rollout.skip.{enable, dump_dir, max_dump_step, action}`` |
| ``rollout_skip_v2_pre``     | ``actor_rollout_ref.rollout.skip.{enable, dump_dir, dump_step, post_dump_action}`` |
| ``skip_manager.rollout``    | ``skip.rollout.{enable, dump_dir, steps, action}``                    |
| ``skip_manager.async_rollout`` | ``skip.async_rollout.{enable, dump_dir, steps, action}``           |
| ``skip_manager.rollout_tq`` | ``skip.rollout_tq.{enable, dump_dir, steps, action}`` (V1 trainer)    |

Exactly one form may be enabled. The run key is ``{experiment_name}_{project_name}`` (verl's own dump
folder name) and the fingerprint is `verl_fingerprint` (``_fingerprint.py``) plus any
``stepjournal.fingerprint`` extras, less ``stepjournal.fingerprint_ignore``.
"""

from __future__ import annotations

import difflib
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import attrs

from stepjournal.log import get_logger
from stepjournal.base import resolve_journal_path
from stepjournal.policies import ConfigError, EngineConfig, EngineOptions, StepRanges, load_config

from ._fingerprint import verl_fingerprint, verl_run_key
from ._nodes import MISSING, child, is_section, plain, select

__all__ = [
    "VerlJournalConfig",
    "read_verl_config",
    "verl_run_key",
    "verl_fingerprint",
    "JOURNAL_DIRNAME",
    "DEFAULT_DUMP_DIR",
]

log = get_logger(__name__)

JOURNAL_DIRNAME = "stepjournal"
DEFAULT_DUMP_DIR = "~/.verl/rollout_dump"

# Keys of the native section, with the EngineConfig field each one feeds (None: adapter-only). Hydra's
# structured section (adapters/verl/hydra_plugins/stepjournal_verl) declares the same keys; a test checks they agree.
_NATIVE_KEYS = {
    "enable": None,
    "policy": "policy",
    "path": "path",
    "dump_dir": None,
    "run": "run",
    "fingerprint": None,
    "compression": "compression",
    "max_size": "max_size",
    "retention": "retention",  # stepjournal.upkeep.Retention's arguments, applied while recording
    "payload_store": "payload_store",  # payloads written as objects under this URL (docs/sharing.md)
    "step_source": None,
    "fingerprint_ignore": None,
    **{name: name for name in EngineOptions.names()},  # every engine option, on_corrupt included
}
_STEP_SOURCES = ("global_steps", "feed_index")


@attrs.frozen
class VerlJournalConfig:
    """What `read_verl_config` found: the engine settings and how the verl adapter applies them.

    Attributes:
        engine: the journal path, policy spec, run key, fingerprint and engine options.
        form: which config form it came from (``"stepjournal"``, ``"rollout_skip_v2"``,
            ``"skip_manager.rollout"`` ...).
        step_source: ``"global_steps"`` (the trainer's step), ``"feed_index"`` (fully-async
            rollouter: the feed index in ``sample_{epoch}_{index}`` uids) or ``"auto"`` (the trainer's
            step for `attach` and `JournaledAgentLoopManager`, the feed index for `install_fully_async`).
        rollout_n: ``actor_rollout_ref.rollout.n``: how many responses each prompt gets.
        keys: the config keys the settings were read from (for messages and the audit).
    """

    engine: EngineConfig
    form: str
    step_source: str = "global_steps"
    rollout_n: int = 1
    keys: Tuple[str, ...] = ()

    @property
    def policy(self) -> Union[str, Dict[str, str]]:
        return self.engine.policy

    @property
    def path(self) -> str:
        return self.engine.path

    @property
    def run(self) -> str:
        return self.engine.run

    @property
    def fingerprint(self) -> Dict[str, Any]:
        return dict(self.engine.fingerprint)


def _bool(value: Any, key: str) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(f"{key}={value!r} must be true or false")


def _int(value: Any, key: str, minimum: int = 0) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return value
    raise ConfigError(f"{key}={value!r} must be an integer >= {minimum}")


def _str(value: Any, key: str) -> str:
    if isinstance(value, str) and value.strip():
        return value
    raise ConfigError(f"{key}={value!r} must be a non-empty string")


def _choice(value: Any, key: str, choices: Tuple[str, ...]) -> str:
    if isinstance(value, str) and value in choices:
        return value
    raise ConfigError(f"{key}={value!r} is not valid: use one of {', '.join(choices)}")


# -- the forms ----------------------------------------------------------------------------------------


def _journal_path(dump_dir: Any, key: str) -> str:
    base = os.path.abspath(os.path.expanduser(_str(dump_dir, key)))
    # The journal is always the fixed child folder; resolving it also refuses a `stepjournal` link
    # planted in a shared dump_dir that points elsewhere.
    return resolve_journal_path(base, JOURNAL_DIRNAME)


def _form_v1(rollout: Any) -> Tuple[str, str, Tuple[str, ...]]:
    prefix = "actor_rollout_ref.rollout"
    dump_dir = plain(child(rollout, "skip_dump_dir"))
    if dump_dir is MISSING or dump_dir is None:
        dump_dir = DEFAULT_DUMP_DIR
    # v1 dumped the first generation once and served that one file for every later call.
    return "cache@1;repeat_last", _journal_path(dump_dir, f"{prefix}.skip_dump_dir"), (
        f"{prefix}.skip_rollout",
        f"{prefix}.skip_dump_dir",
    )


def _form_v2(skip: Any) -> Tuple[str, str, str, Tuple[str, ...]]:
    prefix = "actor_rollout_ref.rollout.skip"
    known = {"enable", "dump_dir", "max_dump_step", "action", "dump_step", "post_dump_action", "compress", "_target_"}
    data = plain(skip) if not hasattr(skip, "__dataclass_fields__") else {
        k: getattr(skip, k) for k in skip.__dataclass_fields__
    }
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"{prefix} has unknown keys {unknown}: expected enable, dump_dir, max_dump_step, action")
    dump_dir = data.get("dump_dir") or DEFAULT_DUMP_DIR
    path = _journal_path(dump_dir, f"{prefix}.dump_dir")
    pre = "dump_step" in data or "post_dump_action" in data
    if pre and ("max_dump_step" in data or "action" in data):
        raise ConfigError(
            f"{prefix} mixes the v2 keys (max_dump_step, action) with the earlier ones (dump_step, "
            "post_dump_action): keep one pair"
        )
    if pre:
        steps = _int(data.get("dump_step", 1), f"{prefix}.dump_step")
        action = _choice(
            data.get("post_dump_action", "repeat"),
            f"{prefix}.post_dump_action",
            ("repeat", "repeat_last", "rollout", "rollout_with_dump"),
        )
        after = {"repeat": "repeat", "repeat_last": "repeat_last", "rollout": "passthrough",
                 "rollout_with_dump": "dump"}[action]
        if steps == 0 and action in ("repeat", "repeat_last"):
            raise ConfigError(f"{prefix}.dump_step=0 needs post_dump_action rollout or rollout_with_dump "
                              "(as verl asserted)")
        spec = after if steps == 0 else f"cache@1-{steps};{after}" if steps > 1 else f"cache@1;{after}"
        read_from = (f"{prefix}.dump_step", f"{prefix}.post_dump_action", f"{prefix}.dump_dir")
        return spec, path, "rollout_skip_v2_pre", read_from
    steps = _int(data.get("max_dump_step", 1), f"{prefix}.max_dump_step")
    action = _choice(data.get("action", "repeat"), f"{prefix}.action", ("cache", "repeat", "repeat_last"))
    if steps == 0:
        if action != "cache":
            raise ConfigError(f"{prefix}.max_dump_step=0 needs action=cache (as verl asserted), got {action!r}")
        spec = "cache"
    else:
        clause = f"cache@1-{steps}" if steps > 1 else "cache@1"
        # v2's `cache` generated without storing after max_dump_step; stepjournal's cache stores.
        spec = f"{clause};{action}"
    return spec, path, "rollout_skip_v2", (f"{prefix}.max_dump_step", f"{prefix}.action", f"{prefix}.dump_dir")


def _form_skip_manager(section: Any, role: str) -> Tuple[str, str, Tuple[str, ...]]:
    prefix = f"skip.{role}"
    data = plain(section) if not hasattr(section, "__dataclass_fields__") else {
        k: getattr(section, k) for k in section.__dataclass_fields__
    }
    unknown = sorted(set(data) - {"enable", "dump_dir", "steps", "action", "_target_"})
    if unknown:
        raise ConfigError(f"{prefix} has unknown keys {unknown}: expected enable, dump_dir, steps, action")
    dump_dir = data.get("dump_dir") or DEFAULT_DUMP_DIR
    path = _journal_path(dump_dir, f"{prefix}.dump_dir")
    steps = data.get("steps") or []
    if not isinstance(steps, (list, tuple)) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps
    ):
        raise ConfigError(f"{prefix}.steps={steps!r} must be a list of non-negative integers")
    action = _choice(data.get("action", "cache"), f"{prefix}.action", ("cache", "repeat"))
    if not steps:
        spec = "passthrough"  # SkipManager touches only the listed steps
    else:
        chosen = "cache" if action == "cache" else "nearest"
        spec = f"{chosen}@{StepRanges.from_steps(steps)};passthrough"
    return spec, path, (f"{prefix}.enable", f"{prefix}.steps", f"{prefix}.action", f"{prefix}.dump_dir")


def _enabled_forms(cfg: Any) -> List[Tuple[str, Any]]:
    found: List[Tuple[str, Any]] = []
    native = child(cfg, "stepjournal")
    if native is not MISSING and native is not None:
        if not is_section(native):
            raise ConfigError(f"stepjournal must be a section (mapping), got {plain(native)!r}")
        enable = plain(child(native, "enable"))
        if enable is MISSING or _bool(enable, "stepjournal.enable"):
            found.append(("stepjournal", native))
    rollout = child(child(cfg, "actor_rollout_ref"), "rollout")
    v1 = plain(child(rollout, "skip_rollout"))
    if v1 is not MISSING and v1 is not None and _bool(v1, "actor_rollout_ref.rollout.skip_rollout"):
        found.append(("rollout_skip_v1", rollout))
    v2 = child(rollout, "skip")
    if v2 is not MISSING and v2 is not None:
        if not is_section(v2):
            raise ConfigError(f"actor_rollout_ref.rollout.skip must be a section, got {plain(v2)!r}")
        enable = plain(child(v2, "enable"))
        if enable is not MISSING and _bool(enable, "actor_rollout_ref.rollout.skip.enable"):
            found.append(("rollout_skip_v2", v2))
    manager = child(cfg, "skip")
    if manager is not MISSING and manager is not None and is_section(manager):
        for role in ("rollout", "async_rollout", "rollout_tq"):
            section = child(manager, role)
            if section is MISSING or section is None:
                continue
            enable = plain(child(section, "enable"))
            if enable is not MISSING and _bool(enable, f"skip.{role}.enable"):
                found.append((f"skip_manager.{role}", section))
    return found


def _native(section: Any, overrides: Mapping[str, Any]) -> Tuple[Dict[str, Any], str, Tuple[str, ...]]:
    data = dict(plain(section)) if not hasattr(section, "__dataclass_fields__") else {}
    data.update(overrides)
    # The structured section (`+stepjournal=verl`, docs/verl.md) holds every key, None where unset.
    data = {key: value for key, value in data.items() if value is not None}
    unknown = sorted(set(data) - set(_NATIVE_KEYS))
    if unknown:
        meant = [difflib.get_close_matches(str(key), list(_NATIVE_KEYS), n=1) for key in unknown]
        hints = "".join(f" (did you mean {close[0]!r} for {key!r}?)" for key, close in zip(unknown, meant) if close)
        raise ConfigError(
            f"stepjournal section has unknown keys {unknown}{hints}: known keys are {', '.join(sorted(_NATIVE_KEYS))}"
        )
    if "policy" not in data:
        raise ConfigError("stepjournal.policy is missing: give a policy spec such as 'cache' or 'dump@1-5;repeat'")
    if data.get("path") is not None and data.get("dump_dir") is not None:
        raise ConfigError("stepjournal.path and stepjournal.dump_dir are both set: the journal is path, or "
                          "dump_dir/stepjournal; keep one")
    if data.get("path") is not None:
        path = os.path.abspath(os.path.expanduser(_str(data["path"], "stepjournal.path")))
    else:
        path = _journal_path(data.get("dump_dir") or DEFAULT_DUMP_DIR, "stepjournal.dump_dir")
    step_source = data.get("step_source", "auto")
    if step_source != "auto":
        _choice(step_source, "stepjournal.step_source", _STEP_SOURCES + ("auto",))
    settings = {field: data[key] for key, field in _NATIVE_KEYS.items() if field and key in data and key != "path"}
    settings["path"] = path
    settings["fingerprint"] = data.get("fingerprint") or {}
    settings["fingerprint_ignore"] = data.get("fingerprint_ignore") or []
    return settings, step_source, tuple(f"stepjournal.{k}" for k in data)


def read_verl_config(cfg: Any, **overrides: Any) -> Optional[VerlJournalConfig]:
    """Build the stepjournal config that a verl config asks for; None when no form is enabled.

    Args:
        cfg: the whole verl config: a dict, an OmegaConf `DictConfig`, or verl's config dataclasses.
        overrides: keys of the native ``stepjournal`` section (``policy=``, ``path=``, ``fingerprint=``
            ...) applied on top; given alone they enable the native form.

    Returns:
        The config, or None when neither a ``stepjournal`` section nor any verl skip form is enabled.

    Raises:
        ConfigError: two forms are enabled at once, a value is malformed (the message names the key
            and the value).
    """
    forms = _enabled_forms(cfg)
    if overrides and not any(name == "stepjournal" for name, _ in forms):
        forms.append(("stepjournal", {}))
    if not forms:
        return None
    if len(forms) > 1:
        names = ", ".join(name for name, _ in forms)
        raise ConfigError(
            f"verl config enables {len(forms)} rollout-skip forms at once ({names}); enable exactly one. "
            "To move to stepjournal, keep the `stepjournal` section and set the old skip form's enable to false"
        )
    form, section = forms[0]
    step_source = "global_steps"
    extra_fp: Dict[str, Any] = {}
    ignored_fp: List[str] = []
    settings: Dict[str, Any]
    if form == "stepjournal":
        settings, step_source, keys = _native(section, overrides)
        extra_fp = settings.pop("fingerprint", None) or {}
        ignored_fp = settings.pop("fingerprint_ignore", None) or []
        if not isinstance(ignored_fp, (list, tuple)) or not all(isinstance(k, str) for k in ignored_fp):
            raise ConfigError(
                f"stepjournal.fingerprint_ignore={ignored_fp!r} must be a list of fingerprint keys such as "
                "['verl.model_path']"
            )
        if not isinstance(extra_fp, Mapping):
            raise ConfigError(f"stepjournal.fingerprint={extra_fp!r} must be a mapping of names to scalars")
    elif form == "rollout_skip_v1":
        spec, path, keys = _form_v1(section)
        settings = {"policy": spec, "path": path}
    elif form == "rollout_skip_v2":
        spec, path, form, keys = _form_v2(section)
        settings = {"policy": spec, "path": path}
    else:
        role = form.split(".", 1)[1]
        spec, path, keys = _form_skip_manager(section, role)
        settings = {"policy": spec, "path": path}
        if role == "async_rollout":
            step_source = "feed_index"
    fingerprint = verl_fingerprint(cfg)
    for key, value in dict(extra_fp).items():
        if not isinstance(key, str):
            raise ConfigError(f"stepjournal.fingerprint key {key!r} must be a string")
        fingerprint[key] = value
    for key in ignored_fp:
        fingerprint.pop(key, None)
    settings.setdefault("run", verl_run_key(cfg))
    settings["fingerprint"] = fingerprint
    try:
        engine = load_config(settings)  # validates the policy spec, once
    except ConfigError as exc:
        raise ConfigError(f"{form}: {exc}") from None
    rollout_n = select(cfg, "actor_rollout_ref.rollout.n", 1)
    rollout_n = rollout_n if isinstance(rollout_n, int) and not isinstance(rollout_n, bool) and rollout_n > 0 else 1
    result = VerlJournalConfig(engine=engine, form=form, step_source=step_source, rollout_n=rollout_n, keys=keys)
    log.info("verl_config_read", form=form, policy=engine.policy, path=engine.path, run=engine.run)
    return result

