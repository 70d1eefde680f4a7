"""Named remotes: ``origin`` for ``s3://bucket/team``, kept in the journal folder's ``remotes.json``.

A remote's name is configuration of this copy of the journal, not something the journal recorded:
it is no event (the log holds what happened; a remote added or removed changes nothing that
happened), it travels with no push, bundle or clone, and it changes in place. So it is a small JSON
file beside ``data.mdb``, written whole and atomically (a temporary file, fsync, rename, fsync of the
folder) under an exclusive lock of the folder, and read bounded (docs/sharing.md, "Named remotes"). Both
files are owned paths of the folder (`base/_owned.py`): never opened through a link, nor waited on as a FIFO.
Keeping it out of LMDB also lets `push` (which opens the journal read-only, beside a live trainer)
read it without a transaction, and ``remote add`` never waits on the trainer's write lock.

Your own names, which every journal of this machine and ``clone`` see (``stepjournal remote add --global``,
as git's and DVC's ``--global``), are kept the same way in ``remotes.json`` of ``$XDG_CONFIG_HOME/stepjournal``
(``~/.config/stepjournal``); the functions take ``None`` for them where they take a journal.

No credential is ever stored: a URL with user info or a query is refused (`RemoteUrlSecretError`).
"""

from __future__ import annotations

import json
import os
import re
import urllib.parse
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional, Protocol, Union

import attrs

from ._bounded_parse import json_document
from ._remote_layout import MANIFEST
from ..base._errors import JournalError, RemoteConfigError, RemoteUrlSecretError
from ..payloads._object_client import is_url, remote_url
from ..base._owned import closing, make_temp, open_file, open_root, remove, replace
from ..base._paths import os_error
from ..base._secrets import public_url

__all__ = ["CONFIG_FILE", "NamedRemote", "PullWords", "add_remote", "checked_url", "list_remotes", "pull_words",
           "remove_remote", "resolve_remote", "resolve_clone_source", "user_config_folder"]

CONFIG_FILE = "remotes.json"
_FORMAT = 1
_MAX_CONFIG = 1 << 20
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


class _Placed(Protocol):
    """A journal as these functions need it: its folder."""

    @property
    def path(self) -> str: ...


# Whose remotes: a journal's (a `Journal`, or its folder), or None for your own.
Where = Union[None, str, "os.PathLike[str]", _Placed]


@attrs.frozen
class NamedRemote:
    """A remote of a journal: its `name`, its `url` (no credentials), and whether it is the `default`."""

    name: str
    url: str
    default: bool


def user_config_folder() -> str:
    """Where your own remotes live: ``$XDG_CONFIG_HOME/stepjournal``, else ``~/.config/stepjournal``."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "stepjournal")


def _folder(journal: Where) -> str:
    if journal is None:
        return user_config_folder()
    return os.fspath(journal if isinstance(journal, (str, os.PathLike)) else journal.path)


def _whose(journal: Where) -> str:
    return f"your remotes ({os.path.join(user_config_folder(), CONFIG_FILE)})" if journal is None else \
        f"journal {_folder(journal)!r}"


def _cli_place(journal: Where) -> str:
    """How the command line names where a remote is kept: ``--global`` or the journal's folder."""
    return "--global" if journal is None else _folder(journal)


def _read(folder: str) -> Dict[str, Any]:
    """The config of the journal at `folder` (an empty one when it has none), checked for its shape."""
    path = os.path.join(folder, CONFIG_FILE)
    try:
        with closing(open_root(folder)) as root:
            fd = open_file(root, CONFIG_FILE, os.O_RDONLY, where=path)
    except FileNotFoundError:
        return {"format": _FORMAT, "default": None, "remotes": []}
    except OSError as exc:
        raise RemoteConfigError(f"cannot read {path!r} ({exc.strerror}): fix or remove it") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read(_MAX_CONFIG + 1)
    try:
        if len(data) > _MAX_CONFIG:
            raise ValueError(f"more than {_MAX_CONFIG} bytes")
        config = json_document(data)
        remotes = config["remotes"]
        if config.get("format") != _FORMAT or not isinstance(remotes, list) or not all(
                isinstance(r, dict) and isinstance(r.get("name"), str) and isinstance(r.get("url"), str)
                and _NAME.fullmatch(r["name"]) for r in remotes):
            raise ValueError("not a remotes file of format 1")
        if config.get("default") not in (None, *(r["name"] for r in remotes)):
            raise ValueError("its default names no remote")
    except (ValueError, KeyError, TypeError) as exc:
        raise RemoteConfigError(f"{path!r} is damaged ({str(exc)[:200]}); fix or remove it, then add the "
                                "remotes again (stepjournal remote add)") from None
    return config


def _existing(journal: Where) -> str:
    folder = _folder(journal)
    if journal is None:  # your own config folder, made on the first `remote add --global`
        return folder
    if not os.path.isfile(os.path.join(folder, "data.mdb")):
        raise JournalError(f"no journal at {folder!r}: the folder or its data.mdb is missing")
    return folder


@contextmanager
def _changing(journal: Where) -> Iterator[Dict[str, Any]]:
    """The config of `journal`, to change in place: written back atomically when the block ends,
    under an exclusive lock of the folder (two ``remote add`` at once do not lose one)."""
    import fcntl

    folder = _existing(journal)
    if journal is None:
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError as exc:
            raise os_error(folder, exc, "create the config folder") from None
    lock = open_root(folder)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        config = _read(folder)
        yield config
        _write(lock, folder, config)
    finally:
        os.close(lock)


def _write(fd: int, folder: str, config: Dict[str, Any]) -> None:
    """`config` written to a new file in `folder` (`fd`, its descriptor), fsynced, renamed over the config
    file, and the folder fsynced."""
    try:
        tmp_fd, tmp = make_temp(fd, f".{CONFIG_FILE}.", where=folder)
    except OSError as exc:
        raise os_error(folder, exc, "change the remotes of") from None
    try:
        with os.fdopen(tmp_fd, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        replace(fd, tmp, fd, CONFIG_FILE, source=os.path.join(folder, tmp), where=os.path.join(folder, CONFIG_FILE))
        os.fsync(fd)
    except BaseException as exc:
        remove(fd, tmp, where=os.path.join(folder, tmp))
        if isinstance(exc, OSError):
            raise os_error(folder, exc, "change the remotes of") from None
        raise


def _listed(config: Dict[str, Any]) -> List[NamedRemote]:
    return [NamedRemote(r["name"], r["url"], r["name"] == config["default"]) for r in config["remotes"]]


def list_remotes(journal: Where) -> List[NamedRemote]:
    """The named remotes of `journal` (a path or a `Journal`; None: your own), in the order they were added."""
    return _listed(_read(_existing(journal)))


def checked_url(url: str, name: str = "NAME") -> str:
    """`url` as a remote's config keeps it: a plain path as its absolute ``file://`` URL.

    Raises:
        RemoteUrlSecretError: it holds user info (a user or password) or a query (a token, a signature).
    """
    url = remote_url(url)
    parts = urllib.parse.urlsplit(url)
    if "@" in parts.netloc or parts.query or parts.fragment:
        held = "user info (a user or password)" if "@" in parts.netloc else "a query (a token or signature)"
        raise RemoteUrlSecretError(
            f"refused remote {name!r}: its URL {public_url(url)} was given with {held}, and a journal keeps no "
            "credentials; put them in the client's environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY ...) or "
            f"config files (~/.aws/credentials) and add the URL without them: stepjournal remote add JOURNAL {name} "
            f"{public_url(url)}")
    return url


def add_remote(journal: Where, name: str, url: str, *, default: bool = False) -> NamedRemote:
    """Name `url` `name` in `journal`'s config (None: your own, which every journal and `clone` see);
    the first remote added (or one added with `default`) is the default one that `push`, `pull` and
    `remote_status` use when given none (a journal's default only: yours is never used unasked).

    Raises:
        RemoteConfigError: the name is taken or not a name (letters, digits, ``-``, ``_``).
        RemoteUrlSecretError: the URL holds credentials (nothing is written).
    """
    if not _NAME.fullmatch(name):
        raise RemoteConfigError(f"{name!r} is not a remote name: letters, digits, '-' and '_', at most 64, "
                                "starting with a letter or digit")
    if journal is None and default:
        raise RemoteConfigError(f"your own remotes have no default (push and pull use a journal's default only, "
                                f"never one of yours unasked): add {name!r} without --default, and name it when you "
                                "push, pull or clone")
    url = checked_url(url, name)
    with _changing(journal) as config:
        if any(r["name"] == name for r in config["remotes"]):
            raise RemoteConfigError(f"{_whose(journal)} has a remote named {name!r} already; remove it "
                                    f"first: stepjournal remote remove {_cli_place(journal)} {name}")
        config["remotes"].append({"name": name, "url": url})
        if journal is not None and (default or config["default"] is None):
            config["default"] = name
        return NamedRemote(name, url, config["default"] == name)


def remove_remote(journal: Where, name: str) -> NamedRemote:
    """Forget remote `name` of `journal` (None: your own; nothing on the remote changes). When it was the
    default, the first remote left (in the order added) becomes the default.

    Raises:
        RemoteConfigError: `journal` has no remote of that name.
    """
    with _changing(journal) as config:
        found = next((r for r in config["remotes"] if r["name"] == name), None)
        if found is None:
            raise RemoteConfigError(_unknown(journal, name, config))
        config["remotes"].remove(found)
        removed = NamedRemote(name, found["url"], config["default"] == name)
        if removed.default and journal is not None:
            config["default"] = config["remotes"][0]["name"] if config["remotes"] else None
        return removed


def _unknown(journal: Where, name: str, config: Dict[str, Any]) -> str:
    names = ", ".join(r["name"] for r in config["remotes"]) or "none"
    return f"{_whose(journal)} has no remote named {name!r} (its remotes: {names})"


def resolve_remote(journal: Where, remote: Optional[str]) -> str:
    """The URL a push or pull of `journal` uses for `remote`: a name of its config or of yours
    (``--global``), None (its default), a URL, or a plain path (a folder: ``../team-remote``). A name
    wins over a folder of the same name; write ``./NAME`` for the folder.

    Raises:
        RemoteConfigError: None and no default remote; a bare name that is neither a remote nor a folder;
            a name (the default's too) that the journal and you both define with different URLs.
    """
    folder = _folder(journal)
    exists = os.path.isfile(os.path.join(folder, "data.mdb"))
    config = _read(folder) if exists else {"default": None, "remotes": []}
    if remote is None:
        if config["default"] is None:
            raise RemoteConfigError(f"journal {folder!r} has no default remote: give a URL or a path, or add one: "
                                    f"stepjournal remote add {folder} NAME URL")
        remote = config["default"]
    found = _url_named(remote, config)
    yours = _url_named(remote, _read(user_config_folder())) if _NAME.fullmatch(remote) else None
    if found is not None and yours is not None and found != yours:
        # A journal folder can come from someone else with its remotes.json: its name never silently
        # takes a push or pull of yours to its URL, nor yours to a URL its owner did not mean.
        raise RemoteConfigError(
            f"remote {remote!r} is {public_url(found)} in journal {folder!r} and {public_url(yours)} in "
            f"{_whose(None)}: give the URL you mean, or remove one of them (stepjournal remote remove {folder} "
            f"{remote}, or stepjournal remote remove --global {remote})")
    found = found or yours
    if found is not None or _given(remote):
        return found or remote
    raise RemoteConfigError(f"{_unknown(journal, remote, config)}, and neither has {_whose(None)}: give a URL, a "
                            f"path (./{remote} for a folder of that name), or add it: stepjournal remote add {folder} "
                            f"{remote} URL")


def resolve_clone_source(source: str) -> str:
    """The URL `clone` reads for `source`: one of your own remote names (``--global``), a URL, or a
    plain path. A name wins over a folder of the same name; write ``./NAME`` for the folder.

    Raises:
        RemoteConfigError: a bare name that is neither one of your remotes nor a folder.
    """
    config = _read(user_config_folder())
    found = _url_named(source, config)
    if found is not None or _given(source):
        return found or source
    raise RemoteConfigError(f"{_unknown(None, source, config)}: give a URL, a path (./{source} for a folder of "
                            f"that name), or add it: stepjournal remote add --global {source} URL")


def _url_named(name: str, config: Dict[str, Any]) -> Optional[str]:
    return next((r["url"] for r in config["remotes"] if r["name"] == name), None)


def _given(remote: str) -> bool:
    """Whether `remote` is itself where to go: a URL, something no name can be, or an existing path."""
    return is_url(remote) or not _NAME.fullmatch(remote) or os.path.exists(remote)


@attrs.frozen
class PullWords:
    """What ``stepjournal pull A B`` means: the `remote` word (a name, a URL or a path) and the `journal`
    folder, and whether they came in git's order (``pull JOURNAL REMOTE``: `swapped`)."""

    remote: str
    journal: str
    swapped: bool


def pull_words(first: str, second: str) -> PullWords:
    """Which of two words is the remote and which the journal, in either order: ``pull REMOTE JOURNAL`` or
    git's ``pull JOURNAL REMOTE``. A word names a remote when it is a URL, a folder holding a remote (its
    ``stepjournal-remote.json``), or a name of the other word's journal or of yours; a journal folder
    (its ``data.mdb``) is never a remote. When both orders read so, the one whose journal exists is
    taken; when neither does, the word that is a journal is the journal, else the first is the remote
    (and the pull's own error says what is wrong with it).

    Raises:
        RemoteConfigError: both orders read as a remote and a journal, with both journals existing or
            neither (the message names both readings).
    """
    readings = [PullWords(first, second, False), PullWords(second, first, True)]
    fits = [w for w in readings if _names_a_remote(w.remote, w.journal) and not _remote_place(w.journal)]
    existing = [w for w in fits if _is_journal(w.journal)]
    if len(fits) == 1 or len(existing) == 1:
        return (existing or fits)[0]
    if fits:
        raise RemoteConfigError(
            f"{first!r} and {second!r} read two ways: pull from remote {first!r} into journal {second!r}, or "
            f"from remote {second!r} into journal {first!r}; give the remote as a URL or a path (./NAME), "
            "as stepjournal remote list shows it")
    journals = [w for w in readings if _is_journal(w.journal) and not _is_journal(w.remote)]
    return journals[0] if len(journals) == 1 else readings[0]


def _is_journal(word: str) -> bool:
    return os.path.isfile(os.path.join(word, "data.mdb"))


def _remote_place(word: str) -> bool:
    """Whether `word` is where a remote is: a URL, or a folder holding a remote's manifest."""
    return is_url(word) or os.path.isfile(os.path.join(word, MANIFEST))


def _names_a_remote(word: str, journal: str) -> bool:
    """Whether `word` names a remote for a pull into `journal`: a remote's place, or a name of the journal's
    remotes or of yours (never a journal folder)."""
    if _is_journal(word):
        return False
    if _remote_place(word):
        return True
    if not _NAME.fullmatch(word):
        return False
    mine = _read(journal) if _is_journal(journal) else {"remotes": []}
    return _url_named(word, mine) is not None or _url_named(word, _read(user_config_folder())) is not None
