"""The typed errors of stepjournal: one base class, each subclass says what to do next."""

from __future__ import annotations

__all__ = [
    "StepJournalError",
    "JournalError",
    "JournalClosedError",
    "JournalFullError",
    "JournalLockedError",
    "JournalFormatError",
    "IntegrityError",
    "PayloadMissingError",
    "EventDecodeError",
    "UnknownEventTypeError",
    "UnsupportedSchemaVersionError",
    "PayloadDecodeError",
    "UnknownCodecError",
    "CodecPluginError",
    "UnsupportedValueError",
    "InvalidKeyError",
    "UnsafePathError",
    "DiffError",
    "RemoteError",
    "RemoteFormatError",
    "RemoteConflictError",
    "RemotePlainHttpError",
    "RemoteMissingError",
    "RemoteCredentialsError",
    "RemoteUnreachableError",
    "RemoteRegionError",
    "RemoteConfigError",
    "RemoteUrlSecretError",
]


class StepJournalError(Exception):
    """Base class of every error stepjournal raises on purpose."""


class JournalError(StepJournalError):
    """The journal cannot do what was asked (bad state, bad arguments, storage trouble)."""


class JournalClosedError(JournalError):
    """The journal was used after `close()`; open a new `Journal` on the same path."""


class JournalFullError(JournalError):
    """The disk or the configured size cap is full; nothing already recorded was harmed."""


class JournalLockedError(JournalError):
    """The journal is opened in an incompatible way elsewhere in this process."""


class JournalFormatError(JournalError):
    """The journal is in a newer format than this stepjournal writes (or reads); the message names the
    version that wrote it.

    Attributes:
        format: the journal's format.
        written_by: the stepjournal version that last wrote it (None when not recorded).
    """

    def __init__(self, message: str, *, format: int, written_by: str | None) -> None:
        super().__init__(message)
        self.format = format
        self.written_by = written_by


class InvalidKeyError(JournalError, ValueError):
    """A run key, mode, step, generation index or another field of an event is not acceptable.

    Raised when a call is recorded with such a value (a NaN duration or fingerprint value, a time
    `datetime` cannot show); the message names the field and the range it must be in.
    """


class UnsafePathError(JournalError, ValueError):
    """A path from a config would leave the folder it must stay in, or is unsafe to use."""


class IntegrityError(StepJournalError):
    """Stored bytes do not match their digest or their index; the journal is damaged.

    Attributes:
        step: the train step the damaged record belongs to, when known.
        detail: what exactly did not match.
    """

    def __init__(self, message: str, *, step: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.step = step
        self.detail = detail


class PayloadMissingError(IntegrityError):
    """A payload the caller named is not in the payload store (lost, deleted, or never written)."""


class EventDecodeError(IntegrityError):
    """An event's bytes could not be decoded into a known event."""


class UnknownEventTypeError(EventDecodeError):
    """An event carries a type tag this version of stepjournal does not know."""


class UnsupportedSchemaVersionError(EventDecodeError):
    """An event carries a schema version newer than this version of stepjournal reads."""


class PayloadDecodeError(IntegrityError):
    """Payload bytes are malformed: truncated, lying about their lengths, or not a payload."""


class UnknownCodecError(PayloadDecodeError):
    """A payload names a custom codec that is not registered in this process.

    Register it with `stepjournal.register_codec` (or import the adapter that registers it) first.
    """


class UnsupportedValueError(StepJournalError, TypeError):
    """A value cannot be stored in a payload; the message names its path and how to register a codec."""


class CodecPluginError(UnknownCodecError, UnsupportedValueError):
    """A codec plugin (an entry point in ``stepjournal.codecs`` or ``stepjournal.codec_names``) failed.

    Raised where its codec was needed: encoding a value of its type (so it is also an
    `UnsupportedValueError`) or decoding a payload of its codec name (so it is also an
    `UnknownCodecError`). The message names the entry point, its target and its distribution; install
    what the plugin needs, reinstall its distribution, or register the codec with `register_codec`.

    Attributes:
        group: the entry-point group (``"stepjournal.codecs"`` or ``"stepjournal.codec_names"``).
        entry_point: the entry point's name: a type's qualified name, or a codec name.
        target: what it points at, ``module:function``.
        distribution, version: the distribution that declares it (None when unknown).
        error: what went wrong, e.g. ``"ModuleNotFoundError: No module named 'x'"``.
    """

    def __init__(
        self,
        message: str,
        *,
        group: str,
        entry_point: str,
        target: str,
        distribution: str | None,
        version: str | None,
        error: str,
    ) -> None:
        super().__init__(message, detail=error)
        self.group = group
        self.entry_point = entry_point
        self.target = target
        self.distribution = distribution
        self.version = version
        self.error = error


class DiffError(StepJournalError, ValueError):
    """`diff_journals` cannot compare what it was asked to: no shared step, an unknown run, session or field."""


class RemoteError(JournalError):
    """Object storage (a payload store's or a push / pull remote's) failed or refused: the message says
    which object and why, never a credential. Check the URL, the network and the service's credentials
    (its usual environment variables or config files)."""


class RemoteFormatError(RemoteError):
    """A remote was written by a newer stepjournal (its format version is higher): upgrade stepjournal."""


class RemoteConflictError(RemoteError):
    """Another push of the same journal to the same remote ran meanwhile (its head moved, or it holds
    the remote's push lock): nothing was lost; run the push again, it continues where that one left off."""


class RemotePlainHttpError(RemoteError):
    """The endpoint is plain ``http://`` and the client refuses it unless told: set ``AWS_ALLOW_HTTP=true``
    (only for a server you trust on a network you trust), or give its ``https://`` address."""


class RemoteMissingError(RemoteError):
    """The bucket a URL names does not exist at the endpoint (or, for a pull or clone, the ``file://``
    folder): check the URL's bucket and the endpoint (``AWS_ENDPOINT_URL``), or create the bucket."""


class RemoteCredentialsError(RemoteError):
    """The service refused the credentials (unknown key, bad signature, access denied): check the
    client's environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``) or its
    config files (``~/.aws/credentials``); stepjournal reads credentials from nowhere else."""


class RemoteUnreachableError(RemoteError):
    """No connection to the endpoint (refused, unknown host, no route): check the endpoint
    (``AWS_ENDPOINT_URL``, the URL's host) and that the server is up and reachable from here."""


class RemoteRegionError(RemoteError):
    """The bucket is in another region than the one the request was signed for (AWS answers such a request
    ``400 AuthorizationHeaderMalformed``, naming the bucket's region): set ``AWS_REGION`` to the bucket's
    region, which the message names (or pass ``region`` in a `Remote`'s options)."""


class RemoteConfigError(RemoteError):
    """A named remote cannot be used or stored: an unknown or taken name, no default remote, or a
    damaged ``remotes.json``; the message says which, and the command that fixes it."""


class RemoteUrlSecretError(RemoteConfigError):
    """A remote's URL holds credentials (user info, a password, a query that may hold a token): the
    journal keeps no credentials. Keep them in the client's environment or config files and add the
    URL without them."""


class ImportClaimError(IntegrityError):
    """A bundle or remote claims something about a journal that the journal's own log there does not
    prove (a provenance marker inside a segment, a payload listed as released with no release of it):
    nothing of that import was committed.

    Attributes:
        segment: the segment that carries the claim.
        claim: what it claims, in words.
    """

    def __init__(self, message: str, *, segment: str = "", claim: str = "") -> None:
        super().__init__(message, detail="unproven claim")
        self.segment = segment
        self.claim = claim


class ImportConflictError(JournalError):
    """An import would change what the journal already replays: an incoming record has the run, mode,
    stage, step and index of a record the journal holds, with other bytes. Nothing was imported.

    Import under another run key (``--as RUN``, ``runs={"old": "new"}``) or keep the journal's records
    (``--keep ours``, ``keep="ours"``: the incoming ones are imported and audited, not served).

    Attributes:
        conflicts: (run, mode, stage, step, index) of each conflicting call (the first 100).
        count: how many conflict in all.
    """

    def __init__(self, message: str, *, conflicts: tuple = (), count: int = 0) -> None:
        super().__init__(message)
        self.conflicts = conflicts
        self.count = count
