"""The seam of payload storage: the `PayloadStore` protocol, the capabilities a store declares, and
`PayloadStoreBase`, their defaults.

A store declares what it can do beyond the required methods (as zarr's ``Store`` declares
``supports_writes``): the capabilities are members of the protocol, `PayloadStoreBase` gives their
defaults, and the journal reads the declaration, never probes for a method. A store given to a `Journal`
has every member (`checked_store`), and passes the conformance suite shipped as `stepjournal.testing`,
which checks each capability it declares.
"""

from __future__ import annotations

import functools

from typing import (Any, Callable, ContextManager, Iterator, List, Optional, Protocol, Sequence, Tuple, TypeVar,
                    runtime_checkable)

from ..base._digest import DIGEST_SIZE
from ..base._errors import IntegrityError, PayloadStoreError, UnsafePathError

__all__ = ["PayloadStore", "PayloadStoreBase", "Release", "Staged", "WriteEvents", "check_digest",
           "checked_store", "problem", "undeclared"]

T = TypeVar("T")
# ``release(start, stop)``: the caller is done with these bytes of a view (see _pages).
Release = Callable[[int, int], None]
# The journal's event commit: ``write_events(in_txn)`` runs ``in_txn(txn)`` (when given) inside the
# write transaction that appends the events, then commits.
WriteEvents = Callable[[Optional[Callable[[Any], None]]], T]


@runtime_checkable
class Staged(Protocol):
    """A payload a store started writing ahead of its `put` (`PayloadStore.stage`)."""

    def named(self, digest: bytes, owner: Any) -> None:
        """The bytes hash to `digest`: the `put` of that digest finishes the write; when `owner` goes away
        first (never recorded), what was written is removed."""

    def discard(self) -> None:
        """Wait for the write and remove what it wrote (the payload will not be recorded)."""


@runtime_checkable
class PayloadStore(Protocol):
    """Content-addressed storage of payload bytes, keyed by the 32-byte digest of the encoding.

    Stores hold bytes only: they never encode, decode or compress. `get` and `view` unwrap a zstd
    frame (the digest names the uncompressed encoding). Implementations must be safe to read from
    several threads and processes at once.

    Capabilities (declared, with defaults in `PayloadStoreBase`):

    - `takes_pieces`: `put` and `commit` take a payload as a list of bytes-like pieces too (written as
      they are, or joined once by the store); False: the journal joins them into one bytes first.
    - `stages_writes`: `stage` may start writing a payload while the journal hashes it; False: `stage`
      is never called.
    - `files`: the payload files this store keeps beside its own table (`verify` lists those no event
      names), or None.
    - `lmdb_bytes(items)`: how many bytes `commit` puts in the journal's own LMDB pages (the map grows
      by that much first); 0 for a store outside the journal's environment.
    - `check_many(items)`: `check` of several payloads at once (`verify`), each problem returned.
    """

    takes_pieces: bool
    stages_writes: bool

    @property
    def files(self) -> Optional["PayloadStore"]:
        """The payload files kept beside this store's table, or None (read-only: an attribute or a property)."""

    def put(self, digest: bytes, blob: Any) -> None:
        """Store `blob` under `digest`. Idempotent: storing the same digest again is a no-op
        (a stored copy that no longer matches its digest is replaced)."""

    def commit(self, items: Sequence[Tuple[bytes, Any]], write_events: WriteEvents[T]) -> T:
        """Make `items` durable and call `write_events` so the events referencing them commit after
        (or with) them; return what `write_events` returns."""

    def get(self, digest: bytes, *, nbytes: Optional[int] = None) -> bytes:
        """The encoded payload stored under `digest`, checked against it.

        Raises:
            PayloadMissingError: nothing is stored under `digest`.
            IntegrityError: the stored bytes are damaged (they do not match `digest`).
        """

    def view(self, digest: bytes, *, nbytes: Optional[int] = None) -> ContextManager[Tuple[Any, Optional[Release]]]:
        """A context manager giving ``(encoded bytes, release or None)``, unchecked and possibly a
        zero-copy view valid only inside it (the journal's load path checks the digest while decoding).
        A store that made a writable buffer for this read alone may give ``_pages.HANDED_OVER`` as
        the release: the load then keeps that buffer, its tensors views of it, instead of copying.

        Raises:
            PayloadMissingError: nothing is stored under `digest`.
        """

    def check(self, digest: bytes, *, nbytes: Optional[int] = None) -> None:
        """Check the payload stored under `digest` against it, in bounded memory (for `verify`).

        Raises:
            PayloadMissingError: nothing is stored under `digest`.
            IntegrityError: the stored bytes are damaged, or unwrap to more than `nbytes` allows.
        """

    def has(self, digest: bytes) -> bool:
        """True when something is stored under `digest`."""

    def __contains__(self, digest: object) -> bool: ...

    def digests(self) -> Iterator[bytes]:
        """Every stored digest, in byte order."""

    def delete(self, digest: bytes) -> bool:
        """Remove what is stored under `digest`; return whether anything was (for retention)."""

    def stage(self, blob: Any) -> Optional[Staged]:
        """Start writing `blob` (a list of pieces) ahead of its `put`; None: nothing staged. Called only
        when `stages_writes` is declared."""

    def lmdb_bytes(self, items: Sequence[Tuple[bytes, Any]]) -> int:
        """The bytes of `items` that `commit` puts in the journal's own LMDB pages."""

    def check_many(self, items: Sequence[Tuple[bytes, Optional[int]]]) -> List[Optional[Exception]]:
        """`check` of each ``(digest, nbytes)``: per item, None when it is whole, else the
        `PayloadMissingError`, `IntegrityError` or `UnsafePathError` `check` raises."""


class PayloadStoreBase:
    """The defaults of a `PayloadStore`'s capabilities: subclass it and write the required methods
    (`put`, `commit`, `get`, `view`, `check`, `has`, `__contains__`, `digests`, `delete`); declare a
    capability by setting its attribute, or overriding its method, in the subclass.

    A store that subclasses nothing declares every capability itself; `open_payload_store` refuses one
    that leaves any undeclared (`PayloadStoreError` names them).
    """

    takes_pieces: bool = False
    stages_writes: bool = False
    files: Optional[PayloadStore] = None

    def stage(self, blob: Any) -> Optional[Staged]:
        """Nothing is staged: the payload is written by its `put` or `commit`."""
        return None

    def lmdb_bytes(self, items: Sequence[Tuple[bytes, Any]]) -> int:
        """None of `items` goes into the journal's LMDB pages."""
        return 0

    def check_many(self, items: Sequence[Tuple[bytes, Optional[int]]]) -> List[Optional[Exception]]:
        """`check` of each item, one after another."""
        check = self.check  # type: ignore[attr-defined]  # a required method of the subclass
        return [problem(functools.partial(check, digest, nbytes=nbytes)) for digest, nbytes in items]


def undeclared(store: object) -> List[str]:
    """The members of `PayloadStore` (methods and declared capabilities) that `store` lacks."""
    return [name for name in _MEMBERS if not hasattr(store, name)]


def checked_store(store: Any) -> PayloadStore:
    """`store`, once it has every member of `PayloadStore` (capabilities included).

    Raises:
        PayloadStoreError: naming the members it lacks.
    """
    missing = undeclared(store)
    if missing:
        raise PayloadStoreError(
            f"payload store {store!r} does not declare {', '.join(missing)}: subclass "
            "stepjournal.payloads.PayloadStoreBase for the defaults of the capabilities, and write the required "
            "methods (docs/journal.md, \"Writing a payload store\")")
    return store


def check_digest(digest: object) -> None:
    """Refuse a payload key that is not a digest (`DIGEST_SIZE` bytes): every store checks the keys it is given."""
    if not isinstance(digest, bytes) or len(digest) != DIGEST_SIZE:
        raise IntegrityError(f"payload digest {digest!r} is malformed: a payload key is {DIGEST_SIZE} bytes")


def problem(check: Callable[[], None]) -> Optional[Exception]:
    """What `check` raised when the payload is missing or damaged (or its file is not a plain file of this
    user: `UnsafePathError`), else None; any other error propagates."""
    try:
        check()
    except (IntegrityError, UnsafePathError) as exc:  # PayloadMissingError is one too
        return exc
    return None


# What a store must have: the protocol's members, the capabilities among them (read from the class, so a new
# member is required at once).
_MEMBERS = tuple(sorted(name for name in vars(PayloadStore) if not name.startswith("_") or name == "__contains__")
                 + sorted(PayloadStore.__annotations__))

