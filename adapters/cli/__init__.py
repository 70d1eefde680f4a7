"""The `stepjournal` command line (``stepjournal = "stepjournal.adapters.cli:main"``).

One module per verb, a shared renderer (``_render``) and the parser with `main` (``_app``); the
export format and the codec-free reader the verbs use live in the journal (`stepjournal.tools.export_payloads`,
`stepjournal.tools.OpaqueReader`).
"""

from ._app import main

__all__ = ["main", "EXPORT_FORMAT_VERSION"]


def __getattr__(name: str):
    # Kept for code that read the export format version here; it lives in the journal now.
    if name == "EXPORT_FORMAT_VERSION":
        from stepjournal.tools import EXPORT_FORMAT_VERSION

        return EXPORT_FORMAT_VERSION
    raise AttributeError(f"module 'stepjournal.adapters.cli' has no attribute {name!r}")
