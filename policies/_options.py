"""`EngineOptions`: the engine's options, defined and validated once for the engine, configs and adapters.

Every place that takes engine options (`Engine`, `EngineConfig`, `journaled`, the TRL and verl
adapters) takes this one object, so an option added here reaches all of them, and a bad value is
refused the same way wherever it comes from.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import Any, Optional, Sequence, Tuple

import attrs

from ._errors import ConfigError, OptionError

__all__ = ["EngineOptions"]


def _bool(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    # Strict: "yes" or 1 in a config is a typo more often than a wish.
    if value is not True and value is not False:
        raise OptionError(attribute.name, value, "True or False")


def _one_of(*allowed: str) -> Any:
    def check(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
        if not (isinstance(value, str) and value in allowed):
            raise OptionError(attribute.name, value, " or ".join(repr(a) for a in allowed))

    return check


def _as_modes(value: Any) -> Any:
    """A list (or any non-text iterable, e.g. an OmegaConf list) as a tuple; anything else as given."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        return value
    return tuple(value)


def _modes(instance: Any, attribute: "attrs.Attribute[Any]", value: Any) -> None:
    if not (isinstance(value, tuple) and all(isinstance(m, str) and m for m in value)):
        raise OptionError(
            attribute.name, value,
            "a list of mode names such as ['validate'] (one mode is a list of one; [] bypasses none)"
        )


@attrs.frozen
class EngineOptions:
    """How the engine carries out and checks each decision; the same for every adapter and config.

    Attributes:
        allow_fingerprint_mismatch: replay records made under another fingerprint (the differences are
            journaled in the replay's reason). False (default): such a replay is refused with
            `FingerprintMismatchError`. Protects against serving generations of another model or shape.
        verify_input: a replay also requires the call's input digest to equal the recorded one.
            Protects against serving completions that belong to other prompts. Default False.
        on_input_mismatch: with `verify_input`, ``"generate"`` (default) regenerates and stores the
            call on a mismatch, ``"error"`` raises `InputMismatchError`; either way the reason is journaled.
        on_stage_input_mismatch: for a call of any stage but ``"generate"`` (a reward, log-probs ...),
            whose record is valid only for the exact input (and weights version) it was computed on:
            ``"error"`` (default) raises `StageInputMismatchError` when the recorded input digest differs
            from the call's, ``"generate"`` computes and stores the call again; either way the reason
            is journaled. This check is always on for those stages (`verify_input` is not needed).
        check_prompts: ``"same_step"``: a replay of the call's own (step, index) is served only when
            the call's input digest equals the recorded one; otherwise the policy is asked again as if
            that record did not exist (``cache`` generates and stores the call, ``replay`` refuses with
            `InputMismatchError`). Checked after the fingerprint, so a changed setting is named as
            such. ``"off"`` (default): no such check (`verify_input` checks every replay). The TRL
            adapter turns it on by default (its prompt ids are the input).
        bypass_modes: modes whose calls skip the policy: they run and are journaled as bypassed,
            nothing stored (default ``("validate",)``). Keeps validation out of record and replay.
        on_corrupt: what to do when the record a replay needs is damaged (its event or payload fails
            its checksum or digest): ``"error"`` (default) journals a refusal and raises the
            `IntegrityError`, which names the step; ``"regenerate"`` generates and stores the call
            instead, with the damage in the journaled reason (storing an identical output also repairs
            the damaged payload). Protects against training on damaged data.

    Raises:
        OptionError: an option has a value it does not take (the message names option, value and
            the values it takes).
    """

    allow_fingerprint_mismatch: bool = attrs.field(default=False, validator=_bool)
    verify_input: bool = attrs.field(default=False, validator=_bool)
    on_input_mismatch: str = attrs.field(default="generate", validator=_one_of("generate", "error"))
    on_stage_input_mismatch: str = attrs.field(default="error", validator=_one_of("error", "generate"))
    check_prompts: str = attrs.field(default="off", validator=_one_of("off", "same_step"))
    bypass_modes: Tuple[str, ...] = attrs.field(default=("validate",), converter=_as_modes, validator=_modes)
    on_corrupt: str = attrs.field(default="error", validator=_one_of("error", "regenerate"))

    @classmethod
    def names(cls) -> Tuple[str, ...]:
        """The option names, in order (what `from_mapping` and the adapters' keyword arguments accept)."""
        return tuple(field.name for field in attrs.fields(cls))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "EngineOptions":
        """Options from a mapping (a config section: dict, OmegaConf ...); missing keys keep their defaults.

        Raises:
            ConfigError: `data` is not a mapping, or has a key that is not an option (the message names
                it and lists the options).
            OptionError: a value is not one the option takes.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"engine options must be a mapping of option names to values, got {data!r}")
        unknown = [key for key in data if key not in cls.names()]
        if unknown:
            raise ConfigError("unknown engine option " + unknown_keys_text(unknown, cls.names()))
        return cls(**{str(key): value for key, value in data.items()})

    @classmethod
    def from_keywords(
        cls, options: Optional["EngineOptions"], keywords: Mapping[str, Any], *, where: str
    ) -> "EngineOptions":
        """The options a function was given as ``options=`` or as the options' own keyword arguments.

        For functions that take ``options=`` or each option as its own keyword
        (``Engine(journal, policy, verify_input=True)``), one or the other.

        Args:
            options: what was passed as ``options=`` (None: not passed).
            keywords: the other keyword arguments the function was given.
            where: the function's name, for messages.

        Raises:
            TypeError: a keyword is not an option; or ``options=`` and option keywords were both given.
            OptionError: an option keyword has a value the option does not take.
        """
        unknown = [key for key in keywords if key not in cls.names()]
        if unknown:
            raise TypeError(f"{where}() got an unexpected keyword argument " + unknown_keys_text(unknown, cls.names()))
        if options is None:
            return cls(**keywords)
        if not isinstance(options, EngineOptions):
            raise TypeError(
                f"{where}(options={options!r}): options must be an EngineOptions; build one from a dict with "
                "EngineOptions.from_mapping(...)"
            )
        if keywords:
            given = ", ".join(f"{key}=" for key in keywords)
            raise TypeError(
                f"{where}() got options= and also {given}: give each option once, e.g. "
                f"options=attrs.evolve(options, {', '.join(f'{k}={v!r}' for k, v in keywords.items())})"
            )
        return options


def unknown_keys_text(unknown: list, valid: Sequence[str], valid_are: str = "the options are") -> str:
    """``'verify_inputs' (did you mean 'verify_input'?); the options are ...``: for unknown-key messages."""
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(str(key), valid, n=1) or [
            name for name in valid if name.casefold() == str(key).casefold()][:1]  # 'TOOLS' means 'tools'
        parts.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return f"{', '.join(parts)}; {valid_are} {', '.join(valid)}"
