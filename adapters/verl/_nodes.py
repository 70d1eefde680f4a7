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
    """OmegaConf containers as plain dicts and lists (resolved); everything else as is."""
    kind = type(value).__name__
    if kind in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def is_section(value: Any) -> bool:
    return isinstance(value, Mapping) or type(value).__name__ == "DictConfig" or hasattr(value, "__dataclass_fields__")
