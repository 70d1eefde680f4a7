"""`EngineConfig`: the settings of a journal and its policy, structured from dicts, YAML or OmegaConf."""

from __future__ import annotations

import os
from typing import Any, Dict, Literal, Optional, Tuple, Union

import attrs
import cattrs

from stepjournal import Journal
from stepjournal._convert import converter

from ._engine import Engine
from ._errors import ConfigError, SpecError
from ._spec import parse

__all__ = ["EngineConfig", "load_config", "open_engine"]

Scalar = Union[str, int, float, bool, None]


def _spec_valid(instance: Any, attribute: Any, value: str) -> None:
    try:
        parse(value)
    except SpecError as exc:
        raise ConfigError(f"policy={value!r} is not a valid policy spec: {exc}") from None


@attrs.frozen
class EngineConfig:
    """Where the journal is and which policy decides each generate call.

    Attributes:
        path: the journal folder.
        policy: a policy spec string (see `stepjournal.policies.parse`), e.g. ``"dump@1-5;repeat"``.
        run: the run key.
        fingerprint: what must match for a recorded generation to be replayed (flat JSON scalars).
        compression: ``"zstd"`` or None.
        allow_fingerprint_mismatch, verify_input, on_input_mismatch, bypass_modes, on_corrupt: see `Engine`.
        max_size: cap on the journal's size in bytes (None: no cap).
    """

    path: str
    policy: str = attrs.field(default="passthrough", validator=_spec_valid)
    run: str = "default"
    fingerprint: Dict[str, Scalar] = attrs.field(factory=dict)
    compression: Optional[Literal["zstd"]] = None
    allow_fingerprint_mismatch: bool = False
    verify_input: bool = False
    on_input_mismatch: Literal["generate", "error"] = "generate"
    bypass_modes: Tuple[str, ...] = ("validate",)
    max_size: Optional[int] = None
    on_corrupt: Literal["error", "regenerate"] = "error"


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
            raise ConfigError("reading YAML needs PyYAML: pip install 'stepjournal[yaml]'") from None
        if os.path.exists(text):
            with open(text, encoding="utf-8") as fh:
                return yaml.safe_load(fh)
        return yaml.safe_load(text)
    return source


def load_config(source: Any) -> EngineConfig:
    """Build an `EngineConfig` from a dict, an OmegaConf object, a YAML file path or YAML text.

    Raises:
        ConfigError: a key is unknown or missing, or a value has the wrong type; the message names them.
    """
    data = _plain(source)
    if not isinstance(data, dict):
        raise ConfigError(f"a stepjournal config must be a mapping, got {type(data).__name__}: {data!r}")
    try:
        return converter.structure(data, EngineConfig)
    except ConfigError:
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


def _find_config_error(exc: BaseException) -> Optional[ConfigError]:
    """A ConfigError raised by one of our validators inside cattrs' exception groups."""
    if isinstance(exc, ConfigError):
        return exc
    for sub in getattr(exc, "exceptions", ()):
        found = _find_config_error(sub)
        if found is not None:
            return found
    return None


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
    )
    return Engine(
        journal,
        parse(config.policy),
        allow_fingerprint_mismatch=config.allow_fingerprint_mismatch,
        verify_input=config.verify_input,
        on_input_mismatch=config.on_input_mismatch,
        bypass_modes=config.bypass_modes,
        on_corrupt=config.on_corrupt,
    )
