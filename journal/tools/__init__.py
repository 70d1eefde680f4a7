"""`stepjournal.tools`: the read-side helpers that the command line (and any reader of a journal) uses.

The audit's rows and their text, the diff report's helpers, sample views, the key layout's parser,
the journal's time format and digests, and the one converter's structuring seam. Each name is
imported on first use (PEP 562), as `stepjournal`'s own are, so a command that needs one of them
loads only its module: ``--help`` never loads numpy (docs/architecture.md, "The tools namespace").

The modules of this folder (``_diff``, ``_export`` ...) are the journal's own; what other rooms use
is named here.
"""

from typing import Any

_MODULE_OF_NAMES = {
    "index._call_rows": ("json_rows", "releases_of"),
    "index._row_text": ("rows_text", "JSON_RAW", "SURROGATE"),
    "index._audit": ("AUDIT_FIELDS", "ACTIONS"),
    "index._samples": ("samples", "samples_of_steps"),
    "events._events": ("iso_time", "CALL_EVENT_TYPES", "check_fingerprint"),
    "events._keys": ("GenKey", "parse_gen_key"),
    "events._structure": ("structure",),
    "base._digest": ("digest_hex",),
    "tools._export": ("choose_run",),
    "tools._compare": ("json_float",),
    "tools._diff_report": ("stage_order", "compact_steps"),
}
_MODULE_OF = {name: module for module, names in _MODULE_OF_NAMES.items() for name in names}

__all__ = list(_MODULE_OF)


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'stepjournal.tools' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"stepjournal.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(__all__)
