"""`EngineConfig`: the settings of a journal, its policy and the engine's options, from dicts, YAML or OmegaConf."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Dict, Literal, Optional, Union

import attrs
import cattrs

from stepjournal import Journal
from stepjournal.errors import StepJournalError
from stepjournal.upkeep import Retention
from stepjournal.tools import structure

from ._engine import Engine
from ._errors import ConfigError, PluginError, SpecError
from ._options import EngineOptions, unknown_keys_text
from ._ranges import StepRanges
from ._stages import parse_stages

__all__ = ["EngineConfig", "load_config", "open_engine", "retention_from_mapping"]

Scalar = Union[str, int, float, bool, None]


def _plain_policy(value: Any) -> Any:
    """A per-stage mapping (an OmegaConf one too) as a plain dict of str -> spec; anything else as given."""
    if isinstance(value, Mapping) or (hasattr(value, "items") and hasattr(value, "_metadata")):
        return {key: spec for key, spec in value.items()}
    return value


def _spec_valid(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if not isinstance(value, (str, dict)):
        raise ConfigError(
            f"policy={value!r} is not a valid policy spec: use a spec string ('cache', "
            "'generate:cache/reward:replay@1-5') or a mapping of stage -> spec"
        )
    try:
        parse_stages(value)
    except SpecError as exc:
        raise ConfigError(f"policy={value!r} is not a valid policy spec: {exc}") from None


def _url_valid(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, str) or "://" not in value or value.startswith("://"):
        raise ConfigError(
            f"payload_store={value!r} is not an object storage URL: give one such as 's3://bucket/prefix', "
            "'gs://bucket/prefix', 'az://container/prefix' or 'file:///shared/folder' (or leave it unset)"
        )


@attrs.frozen(init=False)
class EngineConfig:
    """Where the journal is, which policy decides each generate call, and the engine's options.

    Attributes:
        path: the journal folder.
        policy: a policy spec string (see `stepjournal.policies.parse`), e.g. ``"dump@1-5;repeat"``; or
            a policy per stage (`stepjournal.policies.parse_stages`): a mapping ``{generate: cache,
            reward: "replay@1-5"}`` or the text ``"generate:cache/reward:replay@1-5"``.
        run: the run key.
        fingerprint: what must match for a recorded generation to be replayed (flat JSON scalars).
        compression: ``"zstd"`` or None.
        max_size: cap on the journal's size in bytes (None: no cap).
        retention: retention rules applied while recording, as a mapping of `stepjournal.upkeep.Retention`'s
            arguments (``{"keep_last": 50, "pin": "1-5", "max_bytes": "10G"}``); None: keep everything.
        payload_store: a URL (``s3://bucket/prefix``, ``gs://``, ``az://``, ``file:///path``) where the
            journal writes its payloads as objects, keeping the events and a verified copy locally
            (`Journal`'s ``payload_store=``; the same objects `stepjournal push` to that URL writes);
            None: payloads stay in the journal folder only.
        options: the `EngineOptions`. As before they existed, each option may also be given as its own
            keyword (``EngineConfig(path, verify_input=True)``, not together with ``options=``) and
            read as an attribute (``config.verify_input``).
    """

    path: str
    policy: Union[str, Dict[str, str]] = attrs.field(
        default="passthrough", converter=_plain_policy, validator=_spec_valid
    )
    run: str = "default"
    fingerprint: Dict[str, Scalar] = attrs.field(factory=dict)
    compression: Optional[Literal["zstd"]] = None
    max_size: Optional[int] = None
    retention: Optional[Dict[str, Scalar]] = attrs.field(
        default=None, validator=lambda _i, _a, value: retention_from_mapping(value)
    )
    payload_store: Optional[str] = attrs.field(default=None, validator=lambda _i, _a, value: _url_valid(value))
    options: EngineOptions = attrs.field(factory=EngineOptions)

    def __init__(self, *args: Any, options: Optional[EngineOptions] = None, **keywords: Any) -> None:
        names = EngineOptions.names()
        given = {key: keywords.pop(key) for key in list(keywords) if key in names}
        # mypy counts *args as maybe filling `options`; positional arguments never reach it (it follows them all).
        self.__attrs_init__(  # type: ignore[misc]
            *args, options=EngineOptions.from_keywords(options, given, where="EngineConfig"), **keywords
        )

    def __getattr__(self, name: str) -> Any:
        # Each option reads as a field of the config too: `config.miss` is `config.options.miss`.
        if name in EngineOptions.names():
            return getattr(self.options, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def _plain(source: Any) -> Any:
    """A dict from a dict, an OmegaConf config, a YAML file path or YAML text."""
    if hasattr(source, "_metadata") and type(source).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(source, resolve=True)
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        try:
            import yaml
        except ImportError:  # pragma: no cover - pyyaml ships with the test extra
            raise ConfigError("reading YAML needs PyYAML: pip install 'pyyaml>=6.0'") from None
        if os.path.exists(text):
            with open(text, encoding="utf-8") as fh:
                return yaml.safe_load(fh)
        return yaml.safe_load(text)
    return source


def load_config(source: Any) -> EngineConfig:
    """Build an `EngineConfig` from a dict, an OmegaConf object, a YAML file path or YAML text.

    The engine options sit beside the other keys (``verify_input: true``), or in an ``options``
    mapping; not both.

    Raises:
        ConfigError: a key is unknown or missing, or a value has the wrong type; the message names them
            (`OptionError`, a `ConfigError`, for an engine option's value).
        PluginError: the policy names a plugin that fails to load or gives no policy; raised as it is,
            naming the plugin, its distribution and the cause.
    """
    data = _plain(source)
    if not isinstance(data, dict):
        raise ConfigError(f"a stepjournal config must be a mapping, got {type(data).__name__}: {data!r}")
    data = dict(data)
    names = EngineOptions.names()
    flat = {key: data.pop(key) for key in list(data) if key in names}
    nested = data.pop("options", None)
    if nested is not None and flat:
        raise ConfigError(
            f"the config sets engine options both in 'options' and beside it ({', '.join(flat)}): keep one place"
        )
    keys = tuple(field.name for field in attrs.fields(EngineConfig)) + names
    unknown = [key for key in data if key not in keys]
    if unknown:
        raise ConfigError("unknown key in the stepjournal config: " + unknown_keys_text(unknown, keys, "the keys are"))
    options = EngineOptions.from_mapping(nested if nested is not None else flat)
    # The policy (a spec string or a per-stage mapping) is checked by its own validator, not by cattrs.
    policy = data.pop("policy", "passthrough")
    try:
        # mypy's attrs plugin takes evolve's keywords from EngineConfig's own __init__, not seeing that its
        # **keywords pass every field on to attrs' one.
        return attrs.evolve(structure(data, EngineConfig), options=options, policy=policy)  # type: ignore[call-arg]
    except (ConfigError, PluginError):
        raise
    except cattrs.BaseValidationError as exc:
        own = _find_config_error(exc)
        if own is not None:
            raise own from None
        messages = cattrs.transform_error(exc, path="config")
        # Name the bad value too, not only the key.
        detail = []
        for message in messages:
            key = message.split(" @ ")[-1].removeprefix("config.") if " @ " in message else ""
            head = key.split(".")[0].split("[")[0]
            shown = f" (got {data[head]!r})" if head in data else ""
            detail.append(message + shown)
        raise ConfigError("bad stepjournal config: " + "; ".join(detail)) from None


def _find_config_error(exc: BaseException) -> Optional[Exception]:
    """A ConfigError, or a PluginError, raised by one of our validators inside cattrs' exception groups.

    A plugin the config's policy names can fail to load (or give no policy) while the spec is
    checked; its `PluginError` names the plugin, its distribution and the cause, so it passes
    through as it is instead of becoming cattrs' ``unknown error (...) @ config``.
    """
    if isinstance(exc, (ConfigError, PluginError)):
        return exc
    for sub in getattr(exc, "exceptions", ()):
        found = _find_config_error(sub)
        if found is not None:
            return found
    return None


def retention_from_mapping(mapping: Optional[Dict[str, Any]]) -> Optional[Retention]:
    """The `Retention` a config's ``retention`` mapping names (``pin`` as range text); None for None.

    Raises:
        ConfigError: a key is unknown or a value is malformed; the message names both.
    """
    if mapping is None:
        return None
    fields = [f.name for f in attrs.fields(Retention)]
    unknown = [key for key in mapping if key not in fields]
    if unknown:
        raise ConfigError("unknown key in the config's retention: "
                          + unknown_keys_text(unknown, fields, "the keys are"))
    values = dict(mapping)
    try:
        if isinstance(values.get("pin"), (str, int)):
            values["pin"] = StepRanges.parse(str(values["pin"]))
        return Retention(**values)
    except StepJournalError as exc:
        raise ConfigError(f"retention {dict(mapping)!r} is not valid: {str(exc).splitlines()[0]}") from None


def open_engine(config: EngineConfig | Any) -> Engine:
    """Open the journal a config names and return an `Engine` evaluating its policy."""
    if not isinstance(config, EngineConfig):
        config = load_config(config)
    journal = Journal(
        config.path,
        run=config.run,
        fingerprint=config.fingerprint,
        compression=config.compression,
        max_size=config.max_size,
        retention=retention_from_mapping(config.retention),
        payload_store=config.payload_store,
    )
    return Engine(journal, parse_stages(config.policy), options=config.options)
