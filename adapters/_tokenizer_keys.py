"""The fingerprint keys that name a recording's tokenizer: written by the adapters, read by the command line
(``show --text``, ``diff --text``, ``report``), which reads them without importing verl or TRL.

``tokenizer`` is TRL's, and the one to use in a fingerprint of your own; verl's are where verl loads a run's
tokenizer from (its ``HFModelConfig``): the tokenizer path, else the model's.
"""

from __future__ import annotations

__all__ = ["TOKENIZER_KEY", "VERL_TOKENIZER_KEYS"]

TOKENIZER_KEY = "tokenizer"
VERL_TOKENIZER_KEYS = ("verl.tokenizer_path", "verl.model_path")
