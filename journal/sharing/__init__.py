"""Sharing: push, pull and clone through a remote, bundles, named remotes, and the checks an import passes
before anything is committed.

Public here: the verbs and their reports, named remotes and the redaction of a remote's secrets
(docs/sharing.md).
"""

from typing import TYPE_CHECKING

from ..base._face import lazy_face

if TYPE_CHECKING:
    from ..base._secrets import redact
    from ._bundle import BundleReport, export_bundle, import_bundle, verify_bundle
    from ._pull import PullReport, clone, pull
    from ._remote import PushReport, push
    from ._remotes_config import (NamedRemote, PullWords, add_remote, list_remotes, pull_words, remove_remote,
                                  resolve_clone_source, resolve_remote, user_config_folder)
    from ._status import RemoteStatus, remote_status

__all__ = [
    "push",
    "pull",
    "clone",
    "PushReport",
    "PullReport",
    "remote_status",
    "RemoteStatus",
    "export_bundle",
    "import_bundle",
    "verify_bundle",
    "BundleReport",
    "NamedRemote",
    "PullWords",
    "add_remote",
    "list_remotes",
    "remove_remote",
    "resolve_remote",
    "resolve_clone_source",
    "pull_words",
    "user_config_folder",
    "redact",
]

__getattr__, __dir__ = lazy_face(globals())
