"""Read keys from a verl config however it comes: a dict, an OmegaConf ``DictConfig`` or verl's config dataclasses."""

from __future__ import annotations

from typing import Any, Mapping

from stepjournal.policies import ConfigError

__all__ = ["MISSING", "child", "select", "plain", "is_section"]

_MISSING = MISSING = object()


def _child(node: Any, key: str) -> Any:
    if node is None or node is _MISSING:
        return _MISSING
    if isinstance(node, Mapping) or type(node).__name__ == "DictConfig":
        try:
            return node[key] if key in node else _MISSING
        except Exception as exc:  # an OmegaConf interpolation that does not resolve
            raise ConfigError(f"verl config key {key!r} cannot be read: {exc}") from None
    if hasattr(node, "__dataclass_fields__"):
        return getattr(node, key, _MISSING)
    return _MISSING


def _select(cfg: Any, dotted: str, default: Any = _MISSING) -> Any:
    node = cfg
    for part in dotted.split("."):
        node = _child(node, part)
        if node is _MISSING:
            return default
    return _plain(node)


def _plain(value: Any) -> Any:
    """OmegaConf containers as plain dicts and lists (resolved); everything else as is."""
    kind = type(value).__name__
    if kind in ("DictConfig", "ListConfig"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return value


def _is_section(value: Any) -> bool:
    return isinstance(value, Mapping) or type(value).__name__ == "DictConfig" or hasattr(value, "__dataclass_fields__")



child, select, plain, is_section = _child, _select, _plain, _is_section
