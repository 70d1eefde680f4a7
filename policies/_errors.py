"""Errors of the policy engine, under stepjournal's one base class."""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from stepjournal import StepJournalError

__all__ = [
    "PolicyError",
    "SpecError",
    "PluginError",
    "ConfigError",
    "OptionError",
    "ReplayRefusedError",
    "ReplayMissError",
    "FingerprintMismatchError",
    "InputMismatchError",
    "StageInputMismatchError",
    "PluginLoadError",
    "SpecWarning",
]


class PolicyError(StepJournalError):
    """Base of the policy engine's errors."""


class SpecError(PolicyError, ValueError):
    """A policy spec or step-range text is malformed; the message points at the bad part."""


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
