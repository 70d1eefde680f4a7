"""Journal a TRL run without editing its script.

``STEPJOURNAL=PATH[:POLICY] python -m stepjournal.adapters.trl SCRIPT``.

The runner wraps ``train()`` of TRL's `GRPOTrainer` and `RLOOTrainer` (and so of their subclasses),
then runs the script (or ``-m MODULE``, TRL's own ``trl.scripts.grpo --config ...`` too) as Python
would. Each ``train()`` reads ``STEPJOURNAL`` when it starts, so a TRL ``--config`` YAML may set it in
its ``env:`` section; it opens the journal, attaches (`attach`, the trainer's fingerprint) and closes
the journal when training ends. A script that attaches by itself is left alone. docs/trl.md
("No edit: the environment") shows it; tests/integration/test_trl_env.py runs it.
"""

from __future__ import annotations

import functools
import os
import runpy
import sys
from typing import Any, Callable, List, Optional

import attrs

from stepjournal import DEFAULT_RUN, Journal
from stepjournal.log import get_logger
from stepjournal.policies import SpecError, parse_stages

from ._config import trainer_fingerprint
from ._errors import TrlAdapterError
from ._hooks import attach
from ._stage_spec import stage_policies

__all__ = ["ENV_VAR", "RUN_ENV_VAR", "EnvJournal", "journal_from_env", "install_env_attach", "main"]

log = get_logger(__name__)

ENV_VAR = "STEPJOURNAL"  # PATH[:POLICY]
RUN_ENV_VAR = "STEPJOURNAL_RUN"  # the run key (default: the journal's default run)
_WRAPPED = "__stepjournal_env_attach__"
_USAGE = ("usage: STEPJOURNAL=PATH[:POLICY] python -m stepjournal.adapters.trl (SCRIPT | -m MODULE) [ARGS ...]\n"
          "Runs a TRL script unedited, its GRPOTrainer / RLOOTrainer generations journaled at PATH under POLICY "
          "(default cache); STEPJOURNAL_RUN names the run (docs/trl.md).")


@attrs.frozen
class EnvJournal:
    """What ``STEPJOURNAL`` (and ``STEPJOURNAL_RUN``) ask for: the journal folder, the policy spec, the run key."""

    path: str
    policy: str = "cache"
    run: str = DEFAULT_RUN


def journal_from_env(environ: Optional[Any] = None) -> EnvJournal:
    """Read ``STEPJOURNAL=PATH[:POLICY]`` (the policy after the first ``:``, so a per-stage spec keeps its own).

    Raises:
        TrlAdapterError: the variable is unset, names no path, or its policy does not parse (a typo, or a
            path with a ``:``, whose rest is then read as the policy).
    """
    env = os.environ if environ is None else environ
    value = env.get(ENV_VAR, "")
    path, _, policy = value.partition(":")
    if not path.strip():
        raise TrlAdapterError(
            f"{ENV_VAR}={value!r} names no journal: set {ENV_VAR}=PATH[:POLICY] (for example runs/grpo:cache) in "
            "the environment or in the TRL config's env: section"
        )
    wanted = EnvJournal(path=path, policy=policy.strip() or "cache", run=env.get(RUN_ENV_VAR) or DEFAULT_RUN)
    _checked(wanted, value, parse_stages)
    return wanted


def _checked(wanted: EnvJournal, value: str, parse: Callable[[str], Any]) -> Any:
    """`parse(wanted.policy)`, its `SpecError` as one `TrlAdapterError` that names the variable and how it splits."""
    try:
        return parse(wanted.policy)
    except SpecError as exc:
        raise TrlAdapterError(
            f"{ENV_VAR}={value!r}: {exc} (read as PATH[:POLICY]: the path {wanted.path!r} ends at the first ':')"
        ) from None


def _journaled_train(train: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(train)
    def journaled(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "_stepjournal", None) is not None:  # the script attached a journal itself
            return train(self, *args, **kwargs)
        wanted = journal_from_env()
        # Checked against this trainer's stages before the journal opens: a typo creates no journal folder.
        policy = _checked(wanted, os.environ.get(ENV_VAR, ""), lambda spec: stage_policies(self, spec))
        with Journal(wanted.path, run=wanted.run, fingerprint=trainer_fingerprint(self)) as journal:
            handle = attach(self, journal, policy)
            log.info("trl_env_attached", path=wanted.path, policy=wanted.policy, run=wanted.run)
            try:
                return train(self, *args, **kwargs)
            finally:
                handle.detach()

    setattr(journaled, _WRAPPED, True)
    return journaled


def install_env_attach() -> None:
    """Make every later ``train()`` of a GRPO or RLOO trainer journal as ``STEPJOURNAL`` says (once per process)."""
    from trl import GRPOTrainer, RLOOTrainer

    for cls in (GRPOTrainer, RLOOTrainer):
        if not getattr(cls.train, _WRAPPED, False):
            cls.train = _journaled_train(cls.train)  # type: ignore[method-assign]


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m stepjournal.adapters.trl``: run a script or module with `install_env_attach` done first."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stdout if args else sys.stderr)
        return 0 if args else 2
    if args[0] == "-m" and len(args) < 2:
        print(_USAGE, file=sys.stderr)
        return 2
    if os.environ.get(ENV_VAR) is not None:  # set at launch: a bad value stops here, before the model loads
        try:
            journal_from_env()
        except TrlAdapterError as exc:
            print(f"stepjournal: error: {exc}", file=sys.stderr)
            return 2
    # What `python SCRIPT` / `python -m MODULE` say, and their status, for a script or module that is not there.
    if args[0] == "-m":
        import importlib.util

        try:
            found = importlib.util.find_spec(args[1]) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            print(f"{sys.executable}: No module named {args[1]}", file=sys.stderr)
            return 1
    elif not os.path.isfile(args[0]):
        print(f"{sys.executable}: can't open file {os.path.abspath(args[0])!r}: no such file", file=sys.stderr)
        return 2
    install_env_attach()
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = args
        sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))  # as `python SCRIPT` puts its folder first
        runpy.run_path(args[0], run_name="__main__")
    return 0
