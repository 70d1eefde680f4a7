"""Record and replay the generations of TRL's `GRPOTrainer` and `RLOOTrainer`.

It needs the ``trl`` extra (``pip install -e '.[trl]'`` in a clone).

`attach(trainer, journal, policy)` intercepts the trainer's ``_generate_single_turn`` (or its
``rollout_func``) and returns a `TrlRecorder` handle (`TrlJournal` is its former name, kept as an
alias); `JournaledTrainerMixin`, `JournaledGRPOTrainer` and `JournaledRLOOTrainer` do the same from
the constructor; ``python -m stepjournal.adapters.trl SCRIPT`` with ``STEPJOURNAL=PATH[:POLICY]`` in the
environment (`install_env_attach`, `journal_from_env`) journals a script nobody edits. What each call is
keyed by and what is stored: `stepjournal.adapters.trl._hooks` and docs/trl.md.

The package has the inner shape of every adapter (docs/adapters.md): ``_config`` (the TRL surface it
was written against, modes, the trainer fingerprint), ``_codec`` (the stored payload and the
random-number state), ``_hooks`` (the interception and `attach`, which turns on the engine's
same-step prompt check, `EngineOptions.check_prompts`) and ``_errors``. The errors,
`SUPPORTED_TRL` and `PAYLOAD_FORMAT` import without TRL; the other names raise `ImportError`
naming the ``trl`` extra.
"""

from __future__ import annotations

from typing import Any

from ._codec import PAYLOAD_FORMAT
from ._config import SUPPORTED_TRL
from ._errors import RecordedToolError, TrlAdapterError, TrlSignatureError

_MISSING_TRL: Any = None
try:
    from ._config import trainer_fingerprint
    from ._hooks import (JournaledGRPOTrainer, JournaledRLOOTrainer, JournaledTrainerMixin, TrlJournal, TrlRecorder,
                         attach)
    from ._env import EnvJournal, install_env_attach, journal_from_env
except ModuleNotFoundError as exc:
    if exc.name is None or exc.name.split(".")[0] not in ("trl", "transformers", "accelerate", "datasets"):
        raise
    _MISSING_TRL = exc

__all__ = [
    "SUPPORTED_TRL",
    "PAYLOAD_FORMAT",
    "attach",
    "TrlRecorder",
    "TrlJournal",
    "JournaledTrainerMixin",
    "JournaledGRPOTrainer",
    "JournaledRLOOTrainer",
    "trainer_fingerprint",
    "install_env_attach",
    "journal_from_env",
    "EnvJournal",
    "TrlAdapterError",
    "TrlSignatureError",
    "RecordedToolError",
]


from .._extras import missing_extra  # noqa: E402


def __getattr__(name: str) -> Any:
    if name in __all__ and _MISSING_TRL is not None:
        raise missing_extra(__name__, name, _MISSING_TRL, "TRL", "trl")
    raise AttributeError(f"module 'stepjournal.adapters.trl' has no attribute {name!r}")
