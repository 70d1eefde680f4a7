"""Read keys from a verl config however it comes: a dict, an OmegaConf ``DictConfig`` or verl's config dataclasses."""

from __future__ import annotations

from typing import Any, Mapping

from stepjournal.policies import ConfigError

__all__ = ["MISSING", "child", "select", "plain", "is_section"]

MISSING = object()  # a key the config does not have


def child(node: Any, key: str) -> Any:
    if node is None or node is MISSING:
        return MISSING
    if isinstance(node, Mapping) or type(node).__name__ == "DictConfig":
        try:
            return node[key] if key in node else MISSING
        except Exception as exc:  # an OmegaConf interpolation that does not resolve
            raise ConfigError(f"verl config key {key!r} cannot be read: {exc}") from None
    if hasattr(node, "__dataclass_fields__"):
        return getattr(node, key, MISSING)
    return MISSING


def select(cfg: Any, dotted: str, default: Any = MISSING) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = child(node, part)
        if node is MISSING:
            return default
    return plain(node)


def plain(value: Any) -> Any:
    """OmegaConf containers as plain dicts and lists (resolved); everything else as is.

    Raises:
        ConfigError: a value is an interpolation that does not resolve here (``${oc.env:UNSET}``,
            ``${hydra:...}`` outside Hydra) or Hydra's mandatory ``???``, which would otherwise be read as
            the text ``???``: the message names the key.
    """
    kind = type(value).__name__
    if kind in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf
        from omegaconf.errors import OmegaConfBaseException

        try:
            return OmegaConf.to_container(value, resolve=True, throw_on_missing=True)
        except OmegaConfBaseException as exc:
            key = getattr(exc, "full_key", None) or "?"
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ConfigError(f"verl config key {key!r} cannot be read: {reason}") from None
    return value


def is_section(value: Any) -> bool:
    return isinstance(value, Mapping) or type(value).__name__ == "DictConfig" or hasattr(value, "__dataclass_fields__")
