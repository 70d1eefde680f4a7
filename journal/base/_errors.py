"""The typed errors of stepjournal: one base class, each subclass says what to do next."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple, Union

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
    "PayloadStoreError",
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
    "ImportClaimError",
    "ImportConflictError",
    "ExportError",
    "RetentionError",
    "RetentionConflictError",
    "CompactError",
    "JournalBusyError",
    "PolicyError",
    "SpecError",
    "PluginError",
    "ConfigError",
    "OptionError",
    "StageRoleError",
    "ReplayRefusedError",
    "ReplayMissError",
    "ToolCallError",
    "ToolReplayMissError",
    "ToolStateMismatchError",
    "FingerprintMismatchError",
    "InputMismatchError",
    "StageInputMismatchError",
    "PluginLoadError",
    "SpecWarning",
]


def _rebuilt(cls: type, args: Tuple[Any, ...]) -> "StepJournalError":
    """An error of `cls` with its `args` (the message), without calling ``__init__``; its fields follow as state."""
    error: StepJournalError = cls.__new__(cls, *args)
    error.args = args
    return error


class StepJournalError(Exception):
    """Base class of every error stepjournal raises on purpose."""

    def __reduce__(self) -> Tuple[Any, ...]:
        # `copy` and a trip to another process (a spawn pool, Ray) rebuild an exception as ``cls(*args)``; an
        # ``__init__`` that takes more than the message (step and call index, option and value) then fails there.
        # The fields go as state, set once the error exists, so a field that refers back to it stays a reference.
        return _rebuilt, (type(self), self.args), self.__dict__


# A part of an error's message: text, or an argument it names as ``(name, value)`` (value None: the name alone).
MessagePart = Union[str, Tuple[str, Any]]


def _python_words(name: str, value: Any) -> str:
    """An argument as a Python caller writes it: ``keep_last`` or ``max_bytes='10X'``."""
    return name if value is None else f"{name}={JournalError.shown(value)}"


class JournalError(StepJournalError):
    """The journal cannot do what was asked (bad state, bad arguments, storage trouble).

    Its message is kept as data, so a caller that names the library's arguments otherwise (the command
    line's ``--max-bytes``, a reading command for ``readonly=True``) words it from the parts, never by
    rewriting the text.

    Attributes:
        parts: the message: text, and the arguments it names (of the call that failed, or of the one to
            make instead) as ``(name, value)`` pairs; the message spells them as Python does
            (``readonly=True``, ``max_bytes='10X'``; a value of None: the name alone).
        start: text the message starts with, before the parts (names no argument; usually empty).
    """

    # What a subclass whose own ``__init__`` skips this one's (as errors were made before parts) has: no parts,
    # so `words` gives its message as it prints.
    parts: Tuple[MessagePart, ...] = ()
    start: str = ""

    def __init__(self, *parts: Any, start: str = "") -> None:
        # A part that is neither text nor a (name, value) pair is a message made the old way (an OSError, a
        # path): its text, as `Exception` would print it.
        self.parts = tuple(
            part if isinstance(part, str) or (type(part) is tuple and len(part) == 2 and isinstance(part[0], str))
            else str(part) for part in parts)
        self.start = start
        super().__init__(start + self.words(_python_words))

    def words(self, argument: Callable[[str, Any], str]) -> str:
        """The message (after any start it was given), each argument spelled by ``argument(name, value)``."""
        if not self.parts:
            return str(self)[len(self.start):]
        return "".join(part if isinstance(part, str) else argument(*part) for part in self.parts)

    @staticmethod
    def shown(value: Any) -> str:
        """A value as a message shows it: its repr, clipped to 300 characters (a hostile value may be huge;
        a path to give instead must show whole)."""
        text = repr(value)
        return text if len(text) <= 300 else f"{text[:300]}... ({len(text)} characters)"


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


class PayloadStoreError(JournalError, TypeError):
    """A payload store given to the journal leaves a member of `PayloadStore` undeclared (a method, or a
    capability such as ``takes_pieces``); subclass `stepjournal.payloads.PayloadStoreBase` for the defaults."""


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

    Register it with `stepjournal.payloads.register_codec` (or import the adapter that registers it) first.
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
    """`diff_journals` cannot compare what it was asked to: no shared step, an unknown run, session or field.

    Attributes:
        reason: what is wrong, without the argument to give.
        argument: the keyword argument that settles it (``"run_a"``), or None; the message ends with
            ``choose one with run_a``, and a caller that spells its arguments otherwise (the command
            line's ``--run-a``) words it from this field.
    """

    def __init__(self, reason: str, *, argument: Optional[str] = None) -> None:
        super().__init__(reason if argument is None else f"{reason}; choose one with {argument}")
        self.reason = reason
        self.argument = argument


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


class RetentionError(JournalError, ValueError):
    """Retention rules are malformed, or would release what they must not; nothing was changed.

    Attributes:
        option: the argument of `Retention` whose value is refused (``"max_bytes"``), or None.
        value: that value, whole (None when `option` is None).
        rule: the rule set at fault as `Retention.describe` words it (the message starts
            ``retention '<rule>'``), or None.
        parts: as `JournalError`'s, naming `Retention`'s arguments.
    """

    def __init__(self, *parts: MessagePart, option: Optional[str] = None, value: Any = None,
                 rule: Optional[str] = None) -> None:
        super().__init__(*parts, start="" if rule is None else f"retention {rule!r} ")
        self.option = option
        self.value = value
        self.rule = rule


class RetentionConflictError(RetentionError):
    """Retention rules contradict each other (two rule sets select one group; pins over the byte cap)."""


class CompactError(JournalError):
    """A compaction could not be done; the original journal is unchanged."""


class JournalBusyError(CompactError):
    """The journal is open in a process (this one or another); close it and compact again."""


class ExportError(JournalError):
    """An export cannot be made as asked (no such run, nothing recorded, target folder not empty)."""


# -- the policy engine's (stepjournal.policies): one hierarchy, one public module --------------------------


class PolicyError(StepJournalError):
    """Base of the policy engine's errors."""


class SpecError(PolicyError, ValueError):
    """A policy spec or step-range text is malformed, or a policy is given an option value it does not take;
    the message points at the bad part.

    Attributes:
        option: the policy's option whose value is refused (``"on_missing"``), or None (a malformed text).
        value: that value (None when `option` is None).
        allowed: the values the option takes (empty when `option` is None).
    """

    def __init__(self, message: str = "", *, option: Optional[str] = None, value: Any = None,
                 allowed: Tuple[Any, ...] = ()) -> None:
        super().__init__(message)
        self.option = option
        self.value = value
        self.allowed = allowed

    @classmethod
    def not_one_of(cls, owner: str, option: str, value: Any, allowed: Tuple[Any, ...]) -> "SpecError":
        """The error for ``owner(option=value)`` where `option` takes only `allowed`."""
        shown = [repr(item) for item in allowed]
        choices = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} or {shown[-1]}"
        return cls(f"{owner}({option}={JournalError.shown(value)}) is not valid: use {choices}", option=option,
                   value=value, allowed=tuple(allowed))


class PluginError(PolicyError):
    """A policy plugin could not be loaded, or is not a policy; the message names the plugin."""


class ConfigError(PolicyError, ValueError):
    """A stepjournal config has a bad key or value; the message names both."""


class OptionError(ConfigError):
    """An engine option has a value it does not take; the message names the option, the value and what it takes.

    Attributes:
        option: the option's name (e.g. ``"on_corrupt"``).
        value: the value given.
        allowed: the values the option takes, in words (e.g. ``"'error' or 'regenerate'"``).
    """

    def __init__(self, option: str, value: Any, allowed: str) -> None:
        super().__init__(f"engine option {option}={value!r} is not valid: use {allowed}")
        self.option = option
        self.value = value
        self.allowed = allowed


class StageRoleError(ConfigError):
    """A stage's declared role forbids its policy: a record-only stage given a policy that may replay.

    Attributes:
        stage: the stage (e.g. ``"metrics"``).
        role: its `stepjournal.vocabulary.StageRole`, as its adapter declared it.
        policy: the name of the policy refused (e.g. ``"replay"``).
    """

    def __init__(self, *, stage: str, role: Any, policy: str) -> None:
        super().__init__(
            f"stage {stage!r} is {role.value} (its adapter declares it so): its calls are recorded, never replayed "
            f"into training, and the policy {policy!r} may replay; use {stage}:dump (record) or {stage}:passthrough "
            "(journal, store nothing)"
        )
        self.stage = stage
        self.role = role
        self.policy = policy


class ReplayRefusedError(PolicyError):
    """A generate call could be neither replayed nor generated under the policy; it was journaled.

    Attributes:
        step, gen_index: the call concerned.
    """

    def __init__(self, message: str, *, step: int, gen_index: int) -> None:
        super().__init__(message)
        self.step = step
        self.gen_index = gen_index


class ReplayMissError(ReplayRefusedError):
    """`replay` found nothing recorded for the call."""


class ToolCallError(StepJournalError, ValueError):
    """A tool call that cannot be journaled: arguments that are not canonical JSON, a key out of range."""


class _RefusedToolCall:
    """What a refused tool call carries: its stage, its `ToolCallKey` and its `ToolRequest`."""

    def __init__(self, message: str, *, step: int, stage: str, key: Any, request: Any) -> None:
        super().__init__(message, step=step, gen_index=key.gen_index)  # type: ignore[call-arg]
        self.stage = stage
        self.key = key
        self.request = request


class ToolReplayMissError(_RefusedToolCall, ReplayMissError):
    """`replay` found no recorded response to a tool call's request in its sample and step.

    Attributes:
        stage: the tool's stage (``tool.<name>``).
        key: the call's `ToolCallKey`.
        request: the `ToolRequest` that has no recorded response.
    """


class ToolStateMismatchError(_RefusedToolCall, ReplayRefusedError):
    """A stateful tool's catch-up gave another response than the one served from the recording.

    The live environment would then hold a state the model never saw. Record the sample again
    (``dump``), or make the tool deterministic for the same requests.

    Attributes:
        stage, key, request: the call whose catch-up response differs (its `ToolCallKey`, its `ToolRequest`).
    """


class FingerprintMismatchError(ReplayRefusedError):
    """The recorded generation was made under another fingerprint (model, batch size, ...).

    Attributes:
        differences: key -> (recorded value, current value) for each differing key.
    """

    def __init__(self, message: str, *, step: int, gen_index: int, differences: Dict[str, Tuple[Any, Any]]) -> None:
        super().__init__(message, step=step, gen_index=gen_index)
        self.differences = differences


class InputMismatchError(ReplayRefusedError):
    """`verify_input` is on and the call's input differs from the recorded one."""


class StageInputMismatchError(InputMismatchError):
    """A call of a stage other than ``"generate"`` would replay a record made on another input.

    A recorded reward or log-prob is valid only for the exact batch (and weights version) it was
    computed on, so this check is always on for those stages (`EngineOptions.on_stage_input_mismatch`).

    Attributes:
        stage: the call's stage (e.g. ``"reward"``).
        recorded_digest: the input digest stored with the record.
        current_digest: the digest of the call's input now (input and weights version).
    """

    def __init__(
        self,
        message: str,
        *,
        step: int,
        gen_index: int,
        stage: str,
        recorded_digest: Optional[str],
        current_digest: Optional[str],
    ) -> None:
        super().__init__(message, step=step, gen_index=gen_index)
        self.stage = stage
        self.recorded_digest = recorded_digest
        self.current_digest = current_digest


class PluginLoadError(PluginError, ConfigError):
    """A policy plugin named in a spec or config could not be imported, or gave no policy.

    It is a `PluginError`, and also a `ConfigError` so that `load_config` (whose callers catch
    `ConfigError`) raises it as it is, with its message, when a config names the plugin.

    Attributes:
        plugin: the policy name.
        target: the entry point's ``module:attr``.
        distribution, version: the installed distribution that declares the entry point (None if unknown).
        error: what went wrong, e.g. ``"ModuleNotFoundError: No module named 'x'"``.
    """

    def __init__(
        self,
        message: str,
        *,
        plugin: str,
        target: str,
        distribution: Optional[str],
        version: Optional[str],
        error: str,
    ) -> None:
        super().__init__(message)
        self.plugin = plugin
        self.target = target
        self.distribution = distribution
        self.version = version
        self.error = error


class SpecWarning(UserWarning):
    """A policy spec parses but does something its author probably did not mean (an unreachable clause).

    Issued through Python's `warnings`, so it is shown once per place by default; turn it into an
    error with ``warnings.simplefilter("error", SpecWarning)``.
    """


# Tracebacks, reprs and pickles name each class by its public module, not this private one: what a user
# imports (`from stepjournal.errors import SpecError`) is what an error prints as.
for _name in __all__:
    globals()[_name].__module__ = "stepjournal.errors"
del _name
